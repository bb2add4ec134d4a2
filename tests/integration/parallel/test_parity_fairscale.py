"""The FairScale engine reproduces DDP: per-step losses and final weights, 2 CPU processes, fp32;
its 2-process checkpoints are not resharded onto one.

The runs are parity runs (``tests/helpers/parity.py``): every configuration of a world size
trains in one process group; per-block sharding is in the default tier, the other layouts slow.
Its refusals of partly checkpointed units are ``tests/parallel/test_fairscale.py``.
"""

import shutil

import pytest
import torch
from conftest import assert_same_run, train_in
from helpers.parity import BLOCKS, DDP, RunSpec, define, run_param, trains
from tango.common.exceptions import ConfigurationError

from tango_fairscale.model.causal_lm import ModelWrapper


def fairscale_run(name: str, world_size: int = 2, **sharding) -> str:
    params = {"sharding": sharding} if sharding else {}
    return define(f"fairscale/{name}", RunSpec("fairscale", world_size, engine_params=params))


PER_BLOCK = define(
    "fairscale/per-block",
    RunSpec("fairscale", 2, engine_params={"sharding": {"modules_to_wrap": BLOCKS}}),
)


@pytest.mark.parametrize(
    "run",
    [
        run_param(PER_BLOCK, PER_BLOCK, DDP, id="per-block"),  # per-block units, flat parameters
        *(
            run_param(name, name, DDP, id=name.split("/")[1], slow=True)
            for name in (
                fairscale_run("unflattened", flatten_parameters=False),
                fairscale_run(
                    "checkpointing+offload", activation_checkpointing=True, cpu_offload=True
                ),
                # some of the units
                fairscale_run(
                    "checkpointing-one-unit", activation_checkpointing=[r"model\.transformer\.h\.0"]
                ),
            )
        ),
    ],
)
def test_fairscale_matches_ddp(run, trained_run, tiny_model_dir) -> None:
    reference = trained_run(DDP)
    assert_same_run(reference, trained_run(run))
    # The comparison can fail: the untrained model is far from the reference.
    untrained = ModelWrapper(str(tiny_model_dir))
    with pytest.raises(AssertionError):
        torch.testing.assert_close(
            untrained.state_dict(), reference.state_dict(), atol=1e-5, rtol=0
        )


COMPILED = fairscale_run("compile+checkpointing", compile=True, activation_checkpointing=True)


@pytest.mark.slow
@trains(COMPILED, DDP)
def test_compiled_checkpointed_units_match_ddp(trained_run) -> None:
    """``compile: true`` (torch.compile per block, inside checkpointing and FairScale's wrapper)
    changes speed, not results."""
    assert_same_run(trained_run(DDP), trained_run(COMPILED))


ONE_PROCESS = define("fairscale/one-process", RunSpec("fairscale", 1))


@pytest.mark.slow
@trains(ONE_PROCESS, DDP)
def test_one_process_matches_two(trained_run) -> None:
    """The global batch does not depend on the world size, so neither does the trajectory."""
    assert_same_run(trained_run(DDP), trained_run(ONE_PROCESS))


@trains(PER_BLOCK)
def test_resuming_on_another_device_count_is_refused(
    trained_run, tmp_path, tiny_model_dir, piqa_small
) -> None:
    """FairScale's per-rank shards cannot be resharded: a one-line error says what to do (the
    checkpoints of the 2-process per-block run, resumed on 1)."""
    shutil.copytree(trained_run(PER_BLOCK).work_dir / "checkpoints", tmp_path / "checkpoints")
    with pytest.raises(ConfigurationError) as error:
        train_in(tmp_path, tiny_model_dir, piqa_small, "tango_fairscale::fairscale", 1, 20)
    message = str(error.value)
    assert "cannot reshard" in message and "device_count=2" in message and "\n" not in message
