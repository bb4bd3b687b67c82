"""EventTimedMeter's GPU path (issue 12): steps timed with device events, losses read lagged, no wait on
the step just queued. This machine has no GPU, so torch.cuda.Event and the pinned copy are replaced
by stand-ins driven by a simulated device clock (a mock, for what cannot exist here); the booking
logic under test is the real meter's. Everything else (records, warm-up, the window's
barrier over a real 1-rank gloo process group) is real."""

import types

import pytest
import torch
import torch.distributed as dist

from conftest import end_one_rank_group, init_one_rank_group
from vit_scale.run.meter import EventTimedMeter


class Device:
    """The simulated device: a queue of events it passes when the test advances it."""

    def __init__(self):
        self.time_ms, self.queued, self.waits = 0.0, [], []


class FakeEvent:
    device: Device = None

    def __init__(self, enable_timing=True):
        self.done_at = None

    def record(self):
        self.device.queued.append(self)

    def query(self):
        return self.done_at is not None

    def synchronize(self):
        self.device.waits.append(self)
        while self.done_at is None:
            advance(self.device, 1)

    def elapsed_time(self, end):
        return end.done_at - self.done_at


def advance(device, n_events, ms_each=10.0):
    """The device passes the next n queued events, ms_each apart."""
    for _ in range(n_events):
        event = device.queued.pop(0)
        device.time_ms += ms_each
        event.done_at = device.time_ms


class Recorder:
    def __init__(self):
        self.steps = []

    def step(self, payload):
        self.steps.append(payload)


@pytest.fixture
def meter(monkeypatch, tmp_path):
    import vit_scale.run.memory as memory

    own_group = not dist.is_initialized()
    if own_group:
        init_one_rank_group()
    device = Device()
    FakeEvent.device = device
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: advance(device, len(device.queued)))
    monkeypatch.setattr(EventTimedMeter, "_to_host", staticmethod(lambda loss: loss.detach().float().clone()))
    # the memory probe would ask CUDA for its statistics
    monkeypatch.setattr(memory, "MemoryProbe", lambda device_type: types.SimpleNamespace(reset=lambda: None))
    world = types.SimpleNamespace(device_type="cuda", is_main=True, device="cpu", rank=0, world_size=1)
    train = types.SimpleNamespace(log_every=1, print_every=1, compile=False)
    recorder = Recorder()
    yield EventTimedMeter(world, recorder, train, images_per_step=32, total_steps=6, untimed_steps=2), device, recorder
    if own_group:
        end_one_rank_group()


def test_the_host_waits_only_for_the_step_lag_behind(meter, capsys):
    m, device, recorder = meter
    for step in range(1, 7):
        m.start()
        m.stop(step, torch.tensor(float(step)))
        # the device never finishes on its own here: the meter waits only for step k - LAG
        assert all(ev is not m._pending[-1][2] for ev in device.waits), "waited on the step just queued"
        assert len(m._pending) <= m.LAG
    booked_while_queueing = [r["step"] for r in recorder.steps]
    m.drain()
    records = recorder.steps
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]  # complete, in order
    assert booked_while_queueing == [1, 2, 3, 4]  # two steps behind the host at the end
    assert [r["loss"] for r in records] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert [r["warmup"] for r in records] == [True, True, False, False, False, False]
    assert all(r["step_time_s"] == pytest.approx(0.010) for r in records)  # between its own two events
    assert all(r["images_per_s"] == pytest.approx(3200.0) for r in records)
    assert m.step_times == pytest.approx([0.010] * 4)
    assert (m.steps_booked, m.last_step, m.last_loss) == (6, 6, 6.0)
    # progress lines name completed steps only, in order
    lines = [line for line in capsys.readouterr().out.splitlines() if "step" in line]
    assert [int(line.split()[1].split("/")[0]) for line in lines] == [1, 2, 3, 4, 5, 6]


def test_steps_the_device_has_passed_are_booked_without_waiting(meter):
    m, device, recorder = meter
    m.start()
    m.stop(1, torch.tensor(1.0))
    advance(device, len(device.queued))  # the device catches up on its own
    waits = len(device.waits)
    m.start()
    m.stop(2, torch.tensor(2.0))
    assert [r["step"] for r in recorder.steps] == [1]  # booked by a query, not a wait
    assert len(device.waits) == waits
