"""Tango's own ``torch::train`` step driving our engines on one process: the same weights as our
training step on the same data (``helpers/torch_train.py`` makes both loops run the same
arithmetic), checkpoints it resumes from, a plain ``ModelWrapper`` as its result, and one-line
refusals of what only ``tango_fairscale::train`` does (``pipe`` on two processes: when the step is
built, before any worker). Two processes and the example config under ``tango run`` are
``tests/integration/parallel/test_torch_train_runs.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import engine_config, train_in
from helpers.torch_train import PIPE_ON_TWO, STEPS, assert_bitwise_same_weights, torch_train
from tango.common import Lazy, Params
from tango.common.exceptions import ConfigurationError
from tango.integrations.torch import TrainingEngine
from tango.integrations.torch.train import TorchTrainStep

from tango_fairscale.model.causal_lm import ModelWrapper
from tango_fairscale.train.loop import FINAL_WEIGHTS


@pytest.fixture(scope="module")
def ours(tmp_path_factory, tiny_model_dir: Path, piqa_small):
    """``ours(engine, device_count)``: our training step's final weights (made once per module)."""
    runs: dict[tuple[str, int], dict[str, torch.Tensor]] = {}

    def run(engine: str, device_count: int) -> dict[str, torch.Tensor]:
        if (engine, device_count) not in runs:
            work_dir = tmp_path_factory.mktemp(f"ours-{engine.split('::')[1]}-{device_count}")
            train_in(work_dir, tiny_model_dir, piqa_small, engine, device_count, STEPS)
            runs[engine, device_count] = torch.load(work_dir / FINAL_WEIGHTS, weights_only=True)
        return runs[engine, device_count]

    return run


#: One engine in the default tier, the others in the slow one.
ENGINES = [
    pytest.param(
        f"tango_fairscale::{name}", id=name, marks=[] if name == "fairscale" else [pytest.mark.slow]
    )
    for name in ("ddp", "fairscale", "fsdp2", "pipe")
]


@pytest.mark.parametrize("engine", ENGINES)
def test_one_process_matches_our_step(
    engine: str, ours, tmp_path: Path, tiny_model_dir: Path, piqa_small
) -> None:
    result, work_dir = torch_train(tmp_path, tiny_model_dir, piqa_small, engine, 1)
    assert_bitwise_same_weights(result, work_dir, ours(engine, 1))
    untrained = ModelWrapper(str(tiny_model_dir)).state_dict()  # the comparison can fail
    assert any(
        not torch.allclose(untrained[k], v, atol=1e-4) for k, v in result.state_dict().items()
    )


def test_resumes_its_own_checkpoint(ours, tmp_path: Path, tiny_model_dir: Path, piqa_small) -> None:
    engine = "tango_fairscale::fairscale"
    result, work_dir = torch_train(
        tmp_path, tiny_model_dir, piqa_small, engine, 1, validate=True, crash_after=3
    )
    assert (work_dir / "resumed-at").read_text() == "2"  # the checkpoint of step 2, not the start
    assert_bitwise_same_weights(result, work_dir, ours(engine, 1))


def test_refuses_accuracy_validation(tmp_path: Path, tiny_model_dir: Path, piqa_small) -> None:
    with pytest.raises(ConfigurationError) as error:
        torch_train(
            tmp_path, tiny_model_dir, piqa_small, "tango_fairscale::fairscale", 1,
            validate=True, val_metric_name="acc", minimize_val_metric=False,
        )  # fmt: skip
    message = str(error.value)
    assert "\n" not in message and "use the tango_fairscale::train step" in message


def test_refuses_packed_batches_the_engine_cannot_take(
    tmp_path: Path, tiny_model_dir: Path, piqa_small
) -> None:
    with pytest.raises(ConfigurationError) as error:
        torch_train(
            tmp_path, tiny_model_dir, piqa_small, "tango_fairscale::pipe", 1,
            packed=True, engine_params={"pipe": {"chunks": 1}},
        )  # fmt: skip
    message = str(error.value)
    assert "\n" not in message and "cannot take packed batches" in message


def test_refuses_pipe_on_two_processes_when_the_step_is_built() -> None:
    """Before any worker starts (each of them refused it: 61 lines of output)."""
    engine = Lazy(TrainingEngine, Params(engine_config("tango_fairscale::pipe")))
    with pytest.raises(ConfigurationError) as error:
        TorchTrainStep(training_engine=engine, device_count=2)
    assert str(error.value).startswith(PIPE_ON_TWO) and "\n" not in str(error.value)
    TorchTrainStep(training_engine=engine, device_count=1)  # what the README says works
