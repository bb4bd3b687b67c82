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
