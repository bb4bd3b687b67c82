"""The end record has one shape (vit_scale.record.end.EndRecord), built in one place from what the
meter measured (vit_scale.run.ending.end_record); the schema's required end keys are its fields."""

import jsonschema
import pytest

from vit_scale.record.end import END_KEYS, EndRecord
from vit_scale.record.schema import END
from vit_scale.run.ending import end_record
from vit_scale.run.meter import Figures
from vit_scale.run.session import exit_code


def figures(**changes):
    base = dict(
        images_per_step=8,
        steps_done=6,
        last_step=6,
        last_loss=2.5,
        nonfinite_step=None,
        step_times=[0.5, 0.25, 0.25],
        started_at=0.0,
        window_s=1.25,
        memory={"peak_rss_gib": 0.5},
        memory_window="timed_steps",
    )
    return Figures(**{**base, **changes})


def as_written(end: EndRecord) -> dict:
    return {"event": "end", "time": 1.0, **end.payload()}


def test_the_schema_requires_exactly_the_records_fields():
    assert END["required"] == ["event", "time", *END_KEYS]
    end = EndRecord("skipped", "does not fit", extra={"compile": None})
    assert list(as_written(end)) == ["event", "time", *END_KEYS, "compile"]  # a recipe's keys come last
    jsonschema.validate(as_written(end), END)


def test_figures_become_the_records_figures():
    end = end_record(
        "ok",
        None,
        None,
        figures(),
        device_type="cpu",
        world_size=2,
        flops_per_image=10**9,
        peak_tflops=1.0,
        peaks=[{"peak_rss_gib": 0.5}, {"peak_rss_gib": 1.5}],
        replicas_agree=True,
        replica_checksums=[[1.0]],
    )
    assert (end.steps_done, end.timed_steps, end.final_loss) == (6, 3, 2.5)
    assert end.images_per_s["mean"] == pytest.approx(3 * 8 / 1.25)  # the window's figure, not the steps' mean
    assert end.images_per_s_per_device == pytest.approx(3 * 8 / 1.25 / 2)
    assert end.tflops_per_device == pytest.approx(3 * 8 / 1.25 / 2 * 1e9 / 1e12)
    assert end.mfu == pytest.approx(end.tflops_per_device)
    assert end.memory["peak_rss_gib"]["per_rank"] == [0.5, 1.5] and end.memory["window"] == "timed_steps"
    jsonschema.validate(as_written(end), END)


def test_a_run_stopped_short_keeps_what_it_measured():
    stopped = end_record(
        "timeout",
        "SIGTERM",
        None,
        figures(window_s=None),
        device_type="cpu",
        world_size=1,
        flops_per_image=10**9,
        peak_tflops=None,
        rates=False,
    )
    assert stopped.images_per_s["mean"] == pytest.approx((16 + 32 + 32) / 3)  # per-step mean without a window
    assert stopped.tflops_per_device is None and stopped.mfu is None
    assert stopped.memory["peak_rss_gib"]["per_rank"] == [0.5]  # this rank's alone, no collective
    before_loop = end_record(
        "failed",
        "boom",
        1,
        None,
        device_type="cpu",
        world_size=2,
        flops_per_image=1,
        peak_tflops=None,
        extra={"step": 0},
    )
    # a run stopped before its loop: the recipe's keys after the time split, which without a launch time is empty
    assert before_loop.extra["step"] == 0 and list(before_loop.extra) == ["time_split", "step"]
    assert set(before_loop.extra["time_split"].values()) == {None}
    jsonschema.validate(as_written(before_loop), END)


def test_the_wall_time_is_split_from_the_launch_to_the_record():
    """Launched 15 s ago (the study's VIT_SCALE_LAUNCHED_AT), the loop started 10 s ago, the timed window open
    from 6 s to 1 s ago: start-up 5 s, warm-up 4 s, timed 5 s, the rest 1 s, 15 s in all."""
    import time

    now, epoch = time.perf_counter(), time.time()
    meter = figures(started_at=now - 10, opened_at=now - 6, closed_at=now - 1)
    end = end_record("ok", None, None, meter, device_type="cpu", world_size=1, flops_per_image=1, peak_tflops=None,
                     replicas_agree=True, launched=epoch - 15)  # fmt: skip
    split = end.extra["time_split"]
    assert split["launched_at"] == epoch - 15
    for key, seconds in (("startup_s", 5), ("warmup_s", 4), ("timed_s", 5), ("rest_s", 1), ("wall_s", 15)):
        assert split[key] == pytest.approx(seconds, abs=0.5), key
    jsonschema.validate(as_written(end), END)
    # launched by hand (no launch time): start-up unknown, the wall time from the loop's start
    alone = end_record("ok", None, None, meter, device_type="cpu", world_size=1, flops_per_image=1, peak_tflops=None)
    assert alone.extra["time_split"]["startup_s"] is None
    assert alone.extra["time_split"]["wall_s"] == pytest.approx(10, abs=0.5)


def test_the_launch_time_is_read_from_the_environment(monkeypatch):
    from vit_scale.run.ending import LAUNCHED_AT, launched_at

    monkeypatch.setenv(LAUNCHED_AT, "1764290000.25")
    assert launched_at() == 1764290000.25
    for bad in ("", "soon", "nan", "-1"):
        monkeypatch.setenv(LAUNCHED_AT, bad)
        assert launched_at() is None


def test_exit_codes_follow_the_status_and_a_requeue():
    assert exit_code(EndRecord("ok")) == 0 and exit_code(EndRecord("skipped")) == 6
    assert exit_code(EndRecord("timeout")) == 5
    assert exit_code(EndRecord("timeout", extra={"requeue": True})) == 7
    assert exit_code(EndRecord("failed", extra={"requeue": True})) == 1


def test_each_signal_watcher_closes_its_sockets_when_done():
    """The watcher that writes the end record for a stuck main thread leaves nothing open behind it:
    the check's worker runs many runs in one process, each with its own watcher."""
    import os
    import signal

    from vit_scale.launch.signals import SignalWatcher

    for peer_failure in (None, lambda: False):  # rank 0 polls for a peer's failure, the others wait
        before = len(os.listdir("/proc/self/fd"))
        handler = signal.getsignal(signal.SIGTERM)
        for _ in range(5):
            SignalWatcher(lambda signum: None, grace_s=1.0, peer_failure=peer_failure, poll_s=0.05).done()
        assert len(os.listdir("/proc/self/fd")) == before
        assert signal.getsignal(signal.SIGTERM) is handler
