"""The FSDP2 engine reproduces DDP, and its checkpoints resume on another number of processes.

The parity runs (``tests/helpers/parity.py``) of a world size train in one process group;
per-block sharding is in the default tier, the other layouts and the resumes slow. Its
checkpoints' allow-lists are ``tests/parallel/test_fsdp2.py``."""

import json
from pathlib import Path

import pytest
import torch
from conftest import assert_same_run, assert_same_training, train_in
from helpers.parity import BLOCKS, DDP, DDP_20, RunSpec, define, run_param, trains


def fsdp2_run(name: str, world_size: int = 2, **params) -> str:
    return define(f"fsdp2/{name}", RunSpec("fsdp2", world_size, engine_params=params))


@pytest.mark.parametrize(
    "run",
    [
        run_param(name, name, DDP, id=name.split("/")[1], slow=index > 0)
        for index, name in enumerate(
            [
                fsdp2_run("per-block", sharding={"modules_to_wrap": BLOCKS}),
                fsdp2_run(
                    "checkpointing+offload",
                    sharding={"activation_checkpointing": True, "cpu_offload": True},
                ),
                # Checkpointed modules need not be units (the fairscale engine refuses these two).
                fsdp2_run(
                    "checkpointing-inside-units",
                    sharding={"activation_checkpointing": [r"model\.transformer\.h\.[0-9]+\.attn"]},
                ),
                fsdp2_run(
                    "one-unit",
                    sharding={
                        "modules_to_wrap": [],
                        "activation_checkpointing": [r"model\.transformer\.h\.[0-9]+"],
                    },
                ),
            ]
        )
    ],
)
def test_fsdp2_matches_ddp(run, trained_run) -> None:
    assert_same_run(trained_run(DDP), trained_run(run))


def read_run(work_dir: Path) -> tuple[list[dict], dict[str, torch.Tensor]]:
    from tango_fairscale.records.training_log import read_training_log

    state = torch.load(work_dir / "final_weights.pt", weights_only=True)
    return read_training_log(work_dir / "training_log.jsonl"), state


@pytest.mark.slow
@trains(DDP_20)
@pytest.mark.parametrize("first, second", [(2, 1), (1, 2)], ids=["2-then-1", "1-then-2"])
def test_resume_on_another_device_count(
    first, second, trained_run, tmp_path, tiny_model_dir, piqa_small
) -> None:
    """Save at step 10 on ``first`` processes, resume to step 20 on ``second``: the losses
    continue where they stopped and the run ends where an uninterrupted one does."""
    train_in(tmp_path, tiny_model_dir, piqa_small, "tango_fairscale::fsdp2", first, 10)
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step0000010"
    train_in(tmp_path, tiny_model_dir, piqa_small, "tango_fairscale::fsdp2", second, 20)
    log, state = read_run(tmp_path)
    raw = [json.loads(line) for line in (tmp_path / "training_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in raw if "train_loss" in r] == list(range(1, 21))  # no replay
    assert_same_training(trained_run(DDP_20), log, state)


COMPILED = fsdp2_run("compile-one-process", world_size=1, sharding={"compile": True})


@pytest.mark.slow
@trains(COMPILED, DDP)
def test_compiled_units_match_ddp(trained_run) -> None:
    """``compile: true`` (torch.compile per block, before sharding) changes speed, not results."""
    assert_same_run(trained_run(DDP), trained_run(COMPILED))
