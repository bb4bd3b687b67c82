"""Every run's node health (issue 36, item 5): the probe after the timed window (vit_scale.run.health),
its figures folded per node (vit_scale.record.health.by_node) and the rule that calls a node slow. The
figures the rule reads are fabricated here so that its arithmetic is known; the probe's own timing runs
for real on this CPU (its rate is this machine's and is not asserted). The run's ordering is checked on
the benchmark recipe's real loop and meter over a real 1-rank gloo group, with the model's step and the
probe's measurement replaced by stand-ins that record what they see."""

from __future__ import annotations

import time

import pytest
import torch

from conftest import FAST, end_one_rank_group, init_one_rank_group
from vit_scale.record.health import SLOW_SHARE, by_node, slow_node_text, slow_nodes


def health(**gemm) -> dict:
    """nodes_health of one rank a node with these compute figures (TFLOP/s)."""
    return by_node([{"node": host, "rank": i, "gemm_tflops": v} for i, (host, v) in enumerate(gemm.items())])


# ---------------------------------------------------------------- by_node


def test_a_node_counts_at_its_slowest_rank_and_the_median_is_over_nodes():
    rows = [
        {"node": "local0", "rank": 0, "gemm_tflops": 2.0, "copy_gbps": 900.0},
        {"node": "local0", "rank": 1, "gemm_tflops": 1.5, "copy_gbps": 1000.0},
        {"node": "local1", "rank": 2, "gemm_tflops": 2.1, "copy_gbps": 950.0},
        {"node": "local1", "rank": 3, "gemm_tflops": None, "copy_gbps": None, "error": "OutOfMemoryError: x"},
        {"node": "local2", "rank": 4, "gemm_tflops": 1.9, "copy_gbps": 980.0},
        {"node": "local2", "rank": 5, "gemm_tflops": 2.2, "copy_gbps": 970.0},
    ]
    got = by_node(rows)
    assert got["hosts"] == {
        # each figure its slowest rank's; the slowest rank is the one with the lowest compute
        "local0": {"gemm_tflops": 1.5, "copy_gbps": 900.0, "ranks": 2, "slowest_rank": 1, "error": None},
        # a rank whose probe failed: its host keeps the other rank's figures and says which failed
        "local1": {
            "gemm_tflops": 2.1,
            "copy_gbps": 950.0,
            "ranks": 2,
            "slowest_rank": 2,
            "error": "rank 3: OutOfMemoryError: x",
        },
        "local2": {"gemm_tflops": 1.9, "copy_gbps": 970.0, "ranks": 2, "slowest_rank": 4, "error": None},
    }
    assert got["median"] == {"gemm_tflops": 1.9, "copy_gbps": 950.0}


def test_a_cpu_has_no_copy_figure():
    got = by_node([{"node": "local0", "rank": 0, "gemm_tflops": 0.05, "copy_gbps": None}])
    assert got["hosts"]["local0"]["copy_gbps"] is None and got["median"] == {"gemm_tflops": 0.05, "copy_gbps": None}


# ---------------------------------------------------------------- the rule


def test_a_node_more_than_a_fifth_below_the_median_node_is_named_with_its_share():
    four = health(local0=1.0, local1=1.02, local2=0.98, local3=0.48)
    assert slow_node_text(four) == "a slow node: local3, compute 48% of the median"
    assert slow_nodes(four) == [("local3", "compute", pytest.approx(0.48 / 0.99))]


def test_within_a_fifth_of_the_median_nothing_is_said():
    assert SLOW_SHARE == 0.20
    assert slow_node_text(health(local0=1.0, local1=1.0, local2=0.81)) == ""
    just_below = health(local0=1.0, local1=1.0, local2=0.79)
    assert slow_node_text(just_below) == "a slow node: local2, compute 79% of the median"


def test_one_node_has_nothing_to_be_slow_against():
    assert slow_node_text(health(local0=0.001)) == "" and slow_nodes(health(local0=0.001)) == []
    # and a record without the figures (older records, a failed gather, junk) says nothing
    for junk in (None, {}, {"hosts": {}, "error": "not gathered"}, {"hosts": "x"}, {"hosts": {"a": 1, "b": None}}):
        assert slow_node_text(junk) == ""


def test_a_slow_memory_copy_is_named_and_several_slow_nodes_slowest_first():
    rows = [
        {"node": f"local{i}", "rank": i, "gemm_tflops": g, "copy_gbps": c}
        for i, (g, c) in enumerate([(500, 2000), (500, 900), (240, 2000), (510, 2000), (495, 2000)])
    ]
    assert slow_node_text(by_node(rows)) == (
        "slow nodes: local1, memory copy 45% of the median; local2, compute 48% of the median"
    )


# ---------------------------------------------------------------- the probe


def test_the_probe_times_the_blocks_forward_gemms_on_this_cpu():
    from vit_scale.run.health import rank_figures

    figures = rank_figures("cpu", "vit_micro", 4, "fp32", windows=3, budget_s=0.05)
    assert len(figures["gemm_tflops_windows"]) == 3 and all(r > 0 for r in figures["gemm_tflops_windows"])
    assert figures["gemm_tflops"] == sorted(figures["gemm_tflops_windows"])[1]  # the median window
    assert figures["copy_gbps"] is None and figures["copy_gbps_windows"] == []
    assert figures["seconds"] > 0 and figures["timer"] == "time.perf_counter, windows of fixed length"


def test_the_gpu_copy_is_event_timed_with_one_wait_and_a_buffer_the_memory_allows(monkeypatch):
    """No GPU here: torch.cuda's Event, synchronize and mem_get_info replaced by recorders, the buffers on
    the CPU. The copy's windows are bracketed by events, the host waits once after the last, and the
    buffer is a quarter of the free memory where that is less than COPY_MIB."""
    from vit_scale.run import health as probe

    log = []

    class Event:
        def __init__(self, enable_timing=False):
            assert enable_timing
            self.at = None

        def record(self, stream=None):
            self.at = log.count("copy")
            log.append("record")

        def synchronize(self):
            log.append("wait")

        def elapsed_time(self, end):
            return (end.at - self.at) * 1.0  # 1 ms a copy

    free = 8 << 20
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append("synchronize"))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 10 * free))
    real_copy = torch.Tensor.copy_
    monkeypatch.setattr(torch.Tensor, "copy_", lambda self, src, *a, **k: (log.append("copy"), real_copy(self, src))[1])
    rates = probe._copy_rates(torch.device("cpu"), windows=3, target_s=0.01)
    timed = log[log.index("record") :]
    assert len(rates) == 3 and timed.count("wait") == 1 and timed[-1] == "wait" and "synchronize" not in timed
    calls = timed.count("copy") // 3
    assert rates == [pytest.approx((free // 4) * calls / (calls * 1e-3) / 1e9)] * 3  # GB/s of the buffer copied


# ---------------------------------------------------------------- outside the timed window


class StandInStrategy:
    """The model's step replaced: a fixed 10 ms of work returning a loss (the loop, meter, window,
    barrier and all-reduce around it are the recipe's own)."""

    def setup(self, factory):
        pass

    def train_step(self, images, labels):
        time.sleep(0.01)
        return torch.tensor(1.0)


def test_the_probe_runs_after_the_window_closed_and_changes_none_of_its_figures(monkeypatch):
    from vit_scale.config import load_config
    from vit_scale.launch.world import World
    from vit_scale.recipes.train import Run
    from vit_scale.run import health as probe

    seen = {}

    def stand_in(device, model_name, batch_size, precision, windows=3, budget_s=1.0):
        meter = run.meter
        seen.update(closed=meter.closed, figures=meter.result(), budget=budget_s, model=model_name)
        time.sleep(0.2)  # inside the window this would lengthen it, and lower images/s
        return {"gemm_tflops": 0.5, "copy_gbps": None, "seconds": 0.2}

    monkeypatch.setattr(probe, "rank_figures", stand_in)
    init_one_rank_group()
    try:
        cfg = load_config(None, [*FAST, "strategy=DDP", "train.health_probe_s=0.3"])
        world = World("single", 0, 1, 0, 1, 1, "local0", "127.0.0.1", 0)
        run = Run(cfg, world)
        run.strategy = StandInStrategy()
        run.train()
        after = run.meter.result()
        end = run.end_record("ok")
    finally:
        end_one_rank_group()
    assert seen["closed"] and seen["budget"] == 0.3 and seen["model"] == "vit_micro"
    # every timed step was booked and the window's length agreed before the probe started
    assert len(seen["figures"].step_times) == cfg.train.steps - cfg.train.warmup_steps
    assert seen["figures"].window_s is not None and seen["figures"].window_s < 0.2
    # and nothing the end record's figures come from moved while it ran
    assert after.step_times == seen["figures"].step_times and after.window_s == seen["figures"].window_s
    assert end.images_per_s["mean"] == pytest.approx(3 * 4 / seen["figures"].window_s)
    assert end.get("nodes_health")["hosts"] == {
        "local0": {"gemm_tflops": 0.5, "copy_gbps": None, "ranks": 1, "slowest_rank": 0, "error": None}
    }
    assert end.get("nodes_health")["probe"]["seconds"] == 0.2


def test_the_runs_summary_says_one_line_of_a_slow_node_and_nothing_otherwise():
    from vit_scale.record.end import EndRecord
    from vit_scale.run.ending import figure_lines

    slow = EndRecord("ok", extra={"nodes_health": health(local0=1.0, local1=1.0, local2=1.0, local3=0.48)})
    even = EndRecord("ok", extra={"nodes_health": health(local0=1.0, local1=0.9)})
    assert figure_lines(slow) == ["  a slow node: local3, compute 48% of the median"]
    assert figure_lines(even) == [] and figure_lines(EndRecord("ok")) == []


def test_a_failing_probe_is_recorded_and_a_stop_signal_still_stops_the_run(monkeypatch):
    """Over a real 1-rank gloo group: a probe that raises leaves its rank's error in nodes_health and the
    run goes on; a signal's RunInterrupted raised inside it is the run's to handle (its end record, a
    requeue), never swallowed as a failed probe."""
    import signal

    from vit_scale.launch.signals import RunInterrupted
    from vit_scale.launch.world import World
    from vit_scale.run import health as probe

    world = World("single", 0, 1, 0, 1, 1, "local0", "127.0.0.1", 0)

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 256.00 MiB")

    def stopped(*args, **kwargs):
        raise RunInterrupted(signal.SIGUSR1)

    init_one_rank_group()
    try:
        monkeypatch.setattr(probe, "rank_figures", out_of_memory)
        got = probe.nodes_health(world, "vit_micro", 4, "fp32", 0.1)
        monkeypatch.setattr(probe, "rank_figures", stopped)
        with pytest.raises(RunInterrupted):
            probe.nodes_health(world, "vit_micro", 4, "fp32", 0.1)
    finally:
        end_one_rank_group()
    assert got["hosts"]["local0"] == {
        "gemm_tflops": None,
        "copy_gbps": None,
        "ranks": 1,
        "slowest_rank": None,
        "error": "rank 0: OutOfMemoryError: CUDA out of memory. Tried to allocate 256.00 MiB",
    }
    assert got["error"] is None and got["probe"]["seconds"] is None
