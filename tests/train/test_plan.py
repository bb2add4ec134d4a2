"""The training step's runtime block (``train/plan.py``'s ``TrainRuntime``): its defaults, one
line per bad value naming the block's key; and what a plan says of itself."""

from __future__ import annotations

import signal
from typing import Any

import pytest
from tango.common import Params
from tango.common.exceptions import ConfigurationError

from tango_fairscale.train.plan import DEFAULT_RUNTIME, TrainRuntime


def refusal(**fields: Any) -> str:
    with pytest.raises(ConfigurationError) as error:
        TrainRuntime(**fields)
    assert "\n" not in str(error.value)
    return str(error.value)


def test_the_defaults() -> None:
    assert DEFAULT_RUNTIME == TrainRuntime()
    assert (DEFAULT_RUNTIME.device_count, DEFAULT_RUNTIME.checkpoint_every) == (1, 100)
    assert DEFAULT_RUNTIME.preemption is signal.SIGTERM
    assert TrainRuntime(preemption_signal="SIGUSR1").preemption is signal.SIGUSR1


@pytest.mark.parametrize(
    "name",
    [
        "device_count",
        "log_every",
        "checkpoint_every",
        "keep_checkpoints",
        "eval_batch_size",
        "collective_timeout_s",
    ],
)
@pytest.mark.parametrize("value", [0, -2, 1.5, True])
def test_counts_must_be_positive_integers(name: str, value: Any) -> None:
    expected = f"runtime.{name} must be a positive integer, got {value!r}"
    assert refusal(**{name: value}) == expected


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"pack_sequences": "yes"}, "runtime.pack_sequences must be true or false, got 'yes'"),
        ({"keep_optimizer_state": 1}, "runtime.keep_optimizer_state must be true or false"),
        ({"defer_checkpoints": "no"}, "runtime.defer_checkpoints must be true or false"),
        ({"distributed_port": 0}, "runtime.distributed_port must be a positive integer or null"),
        (
            {"preemption_signal": "SIGTREM"},
            "unknown runtime.preemption_signal 'SIGTREM'; did you mean 'SIGTERM'?; choose one "
            "of SIGTERM, SIGUSR1, SIGUSR2, SIGINT",
        ),
    ],
)
def test_bad_values_are_refused_in_one_line(fields: dict, message: str) -> None:
    assert refusal(**fields).startswith(message)


def test_a_config_block_builds_it_and_null_packing_is_kept() -> None:
    """``runtime: {...}`` as a config gives it (Tango's ``from_params``)."""
    built = TrainRuntime.from_params(Params({"device_count": 2, "pack_sequences": None}))
    assert built == TrainRuntime(device_count=2, pack_sequences=None)
