"""``train/lr_schedule.py``: the warmup factor per step, then constant, linear or cosine decay to
zero at the last step; refusals before any training (the schedule block checked when Tango
builds the training step)."""

from __future__ import annotations

import math

import pytest
import torch
from tango.common import Lazy, Params
from tango.common.exceptions import ConfigurationError
from tango.integrations.torch import TrainingEngine

from tango_fairscale.compat import check_engine_config
from tango_fairscale.train.lr_schedule import WarmupSchedule


def schedule(**options) -> WarmupSchedule:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    return WarmupSchedule(optimizer, **options)


def test_warmup_rises_linearly_then_stays() -> None:
    warmup = schedule(warmup_steps=3)
    assert [warmup.factor(step) for step in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    assert schedule().factor(0) == 1.0  # no warmup


@pytest.mark.parametrize("decay", ["linear", "cosine"])
def test_decay_reaches_zero_at_the_last_step(decay: str) -> None:
    decaying = schedule(warmup_steps=2, train_steps=10, decay=decay)
    assert decaying.factor(2) == 1.0  # the first step after warmup
    assert decaying.factor(10) == pytest.approx(0.0, abs=1e-12)
    middle = decaying.factor(6)  # half way through the decay
    assert middle == pytest.approx(0.5 if decay == "linear" else 0.5 * (1 + math.cos(math.pi / 2)))


def test_the_optimizer_steps_at_the_factors() -> None:
    warmup = schedule(warmup_steps=1, train_steps=3, decay="linear")
    optimizer = warmup.optimizer
    rates = []
    for _ in range(3):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        warmup.step()
    assert rates == pytest.approx([0.5, 1.0, 0.5])


@pytest.mark.parametrize(
    "options, message",
    [
        ({"warmup_steps": -1}, "warmup_steps must be 0 or a positive integer, got -1"),
        ({"warmup_steps": True}, "warmup_steps must be 0 or a positive integer, got True"),
        ({"decay": "exp"}, "unknown decay 'exp'"),
        ({"decay": "linear"}, "train_steps must be a positive integer, got None"),
        ({"warmup_steps": 5, "train_steps": 5, "decay": "cosine"}, "leaves no steps to decay"),
    ],
)
def test_bad_settings_are_refused_in_one_line(options, message) -> None:
    with pytest.raises(ConfigurationError, match=message):
        schedule(**options)
    with pytest.raises(ConfigurationError, match=message):  # when Tango builds the step
        check_engine_config(engine_with_schedule(options), world_size=1)


def engine_with_schedule(options: dict) -> Lazy:
    """A ``ddp`` engine config (a ``Lazy``, as the training step receives it) with ``options``
    as its ``tango_fairscale::warmup`` schedule."""
    schedule_block = {"type": "tango_fairscale::warmup", **options}
    engine = {"type": "tango_fairscale::ddp", "lr_scheduler": schedule_block}
    return Lazy(TrainingEngine, Params(engine))


def test_the_configs_pass_a_negative_warmup_on_to_be_refused() -> None:
    """``-D warmup_steps=-2`` (constant decay) reaches the schedule, not dropped unseen."""
    from conftest import REPO_ROOT
    from test_mc_suite_config import evaluate

    steps = evaluate(REPO_ROOT / "configs" / "gpt2_piqa.jsonnet", warmup_steps="-2")["steps"]
    lazy = Lazy(TrainingEngine, Params(steps["trained_model"]["engine"]))
    with pytest.raises(ConfigurationError, match="warmup_steps must be 0 or a positive integer"):
        check_engine_config(lazy, world_size=1)
