"""``train/meter.py``: tokens/s over the interval since the last report (pauses left out), MFU
only where a GPU's peak is known, and the time split's phases and line."""

from __future__ import annotations

import pytest
import torch

import tango_fairscale.train.meter as meter
from tango_fairscale.train.meter import PhaseClock, Throughput, peak_flops


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(meter.time, "perf_counter", fake)
    return fake


def test_tokens_per_s_counts_real_tokens_and_leaves_pauses_out(clock: FakeClock) -> None:
    throughput = Throughput(num_parameters=1_000, device=torch.device("cpu"), world_size=2)
    clock.now += 5.0  # a validation before the first interval: skipped
    throughput.skip()
    throughput.count({"attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])})
    assert throughput.tokens == 5  # padding is not counted
    clock.now += 2.0
    figures = throughput.report(tokens_on_all_ranks=40)
    assert figures == {"tokens_per_s": 20.0, "elapsed_s": 7.0}  # no MFU, no memory on a CPU
    assert throughput.tokens == 0
    clock.now += 4.0
    assert throughput.report(tokens_on_all_ranks=8)["tokens_per_s"] == 2.0


def test_mfu_uses_the_gpus_peak_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(meter.torch.cuda, "get_device_name", lambda device: "NVIDIA H200")
    assert peak_flops(cuda) == 989e12
    monkeypatch.setattr(meter.torch.cuda, "get_device_name", lambda device: "Some GPU")
    assert peak_flops(cuda) is None
    assert peak_flops(torch.device("cpu")) is None


def test_the_time_split_adds_laps_by_phase_and_names_the_mean_step(clock: FakeClock) -> None:
    phases = PhaseClock()
    for phase, seconds in [("setup", 1.0), ("first_step", 3.0), ("steps", 2.0),
                           ("validation", 0.5), ("steps", 2.0)]:  # fmt: skip
        clock.now += seconds
        phases.lap(phase)
    assert phases.summary() == {"setup": 1.0, "first_step": 3.0, "steps": 4.0, "validation": 0.5}
    assert phases.describe(first=1, steps=5) == (
        "time split: setup 1.0 s, first step 3.0 s, 4 more steps 4.0 s (1000.0 ms each), "
        "validation 0.5 s"
    )
    # Resumed: the first logged step came after several.
    assert "first 3 steps 3.0 s, 2 more steps 4.0 s (2000.0 ms each)" in phases.describe(3, 5)


def test_phases_timed_before_the_clock_come_first_and_zeros_are_left_out(clock: FakeClock) -> None:
    phases = PhaseClock(data=1.5, engine=0.0)
    clock.now += 2.0
    phases.lap("engine")
    clock.now += 0.5
    phases.lap("setup")
    assert phases.summary() == {"data": 1.5, "engine": 2.0, "setup": 0.5}
    assert phases.describe(first=1, steps=0) == "time split: data 1.5 s, engine 2.0 s, setup 0.5 s"
