"""The FSDP2 engine reproduces DDP, and its checkpoints resume on another number of processes.

The parity runs (``tests/helpers/parity.py``) of a world size train in one process group;
per-block sharding is in the default tier, the other layouts and the resumes slow."""

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


class Payload:
    """Unpickling this runs ``touch MARKER``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


#: ``train_in``'s first 5 steps on one process, whose checkpoint the test plants a payload in.
FIVE_STEPS = define(
    "fsdp2/five-steps-one-process",
    RunSpec("fsdp2", 1, train_steps=5, checkpoint_every=5, validate=False),
)


@trains(FIVE_STEPS)
@pytest.mark.parametrize("payload", ["pickled-class", "dotted-global", "byte-entry"])
def test_malicious_checkpoint_files_are_refused(
    payload, trained_run, tmp_path, tiny_model_dir, piqa_small
) -> None:
    """torch.distributed.checkpoint reads its metadata with plain pickle and its non-tensor
    entries with ``torch.load(weights_only=False)``: the engine reads both through allow-lists,
    so a planted payload never runs — a pickled class, a dotted name under an allowed module
    (``torch.distributed.checkpoint.metadata`` / ``os.system``), an optimizer entry. The manifest
    is forged to match the planted files (a digest proves integrity, not intent)."""
    import pickle
    import shutil

    from helpers.checkpoints import reseal
    from helpers.hostile_pickles import calling_pickle, plant_byte_entry
    from tango.common.exceptions import ConfigurationError

    work = tmp_path / "run"
    shutil.copytree(trained_run(FIVE_STEPS).work_dir / "checkpoints", work / "checkpoints")
    checkpoint = work / "checkpoints" / "step0000005"
    marker = tmp_path / "payload-ran"
    if payload == "pickled-class":
        (checkpoint / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    elif payload == "dotted-global":
        dotted = calling_pickle("torch.distributed.checkpoint.metadata", "os.system", marker)
        (checkpoint / ".metadata").write_bytes(dotted)
    else:
        key = "optimizer.param_groups.0.lr"
        plant_byte_entry(checkpoint, key, calling_pickle("os", "system", marker))
    reseal(checkpoint)
    with pytest.raises(ConfigurationError, match=f"checkpoint {checkpoint} cannot be loaded"):
        train_in(work, tiny_model_dir, piqa_small, "tango_fairscale::fsdp2", 1, 10)
    assert not marker.exists()
