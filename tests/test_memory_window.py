"""Peak memory is the timed window's (issue 18, item 5): what runs after the window closes (the
replica check copies every local tensor to float64, profiled steps, checkpoints) must not reach the
figure. Real EventTimedMeter, real CPU memory probe (peak RSS), real 1-rank gloo group."""

import types

import torch
import torch.distributed as dist

from conftest import end_one_rank_group, init_one_rank_group
from vit_scale.run.ending import memory_summary
from vit_scale.run.memory import GIB
from vit_scale.run.meter import EventTimedMeter


class Recorder:
    def step(self, payload):
        pass


def test_peak_is_read_when_the_timed_window_closes():
    own_group = not dist.is_initialized()
    if own_group:
        init_one_rank_group()
    try:
        world = types.SimpleNamespace(device_type="cpu", is_main=True, device="cpu", rank=0, world_size=1)
        train = types.SimpleNamespace(log_every=1, print_every=100, compile=False)
        meter = EventTimedMeter(world, Recorder(), train, images_per_step=4, total_steps=3, untimed_steps=1)
        for step in range(1, 4):
            meter.start()
            meter.stop(step, torch.ones(64, 64).sum())
        assert meter.window_s() > 0
        in_window = meter.probe.peak()["peak_rss_gib"]
        # after the window: 512 MiB written (so resident), as the end-of-run work would allocate
        after = torch.ones(64 * 1024 * 1024, dtype=torch.float64)
        assert after.sum().item() == after.numel()
        reported = meter.probe.peak()["peak_rss_gib"]
        assert reported == in_window, "the peak moved after the window closed"
        figures = meter.result()
        assert figures.memory == meter.probe.peak() and figures.memory_window == "timed_steps"
        assert (
            memory_summary("cpu", [figures.memory], figures.memory_window)["peak_rss_gib"]["max"] < in_window + 0.25
        ), "the end-of-run allocation reached the recorded peak"
        assert meter.probe.window == "timed_steps"
        del after
        # a new window (the next run in the same process) measures afresh
        meter.probe.reset()
        assert meter.probe.peak()["peak_rss_gib"] * GIB > 0
    finally:
        if own_group:
            end_one_rank_group()


def test_a_gpu_window_reads_the_active_peak_beside_allocated_and_reserved(monkeypatch):
    """On a GPU the probe reads torch's active_bytes peak (allocated plus memory freed onto another stream
    and not yet reusable: the plan's peak_active_gib) beside max allocated and reserved, and the end
    record's summary carries it over the ranks. No GPU here: torch.cuda's three counters are replaced by
    fixed figures (the only stand-in), the probe and the summary are the real ones."""
    from vit_scale.run.memory import MemoryProbe

    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 3 * GIB)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda: 5 * GIB)
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda: {"active_bytes.all.peak": 4 * GIB})
    probe = MemoryProbe("cuda")
    probe.reset()
    probe.close()
    peak = probe.peak()
    assert peak == {"peak_allocated_gib": 3.0, "peak_reserved_gib": 5.0, "peak_active_gib": 4.0}
    summary = memory_summary("rocm", [peak, {**peak, "peak_active_gib": 4.5}], probe.window)
    assert summary["peak_active_gib"]["max"] == 4.5
