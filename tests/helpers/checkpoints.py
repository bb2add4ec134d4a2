"""Doing to a saved checkpoint what a disk, a careless copy or a forger would."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any


def damage_in_place(path: Path) -> None:
    """Overwrite 4 bytes in the middle of ``path`` (inside tensor data) with ``7f7fffff``, the
    largest float32 (3.4e38): the file keeps its size and still loads."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4] = b"\xff\xff\x7f\x7f"
    path.write_bytes(bytes(data))


def truncate(path: Path, keep: int = 1000) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def replace_file(target: Path, source: Path) -> None:
    """``target`` becomes a copy of ``source`` (a file of another checkpoint)."""
    shutil.copyfile(source, target)


def reseal(directory: Path) -> None:
    """Rewrite the manifest of checkpoint ``directory`` for its files as they are now, as a forger
    would: the digests then match and only the loaders stand between the files and the run."""
    from tango_fairscale.records.checkpoints import (
        MANIFEST,
        Manifest,
        file_record,
        read_manifest,
        write_manifest,
    )

    manifest = read_manifest(directory)
    files = {
        path.relative_to(directory).as_posix(): file_record(path)
        for path in sorted(directory.rglob("*"))
        if path.is_file() and path.name != MANIFEST
    }
    write_manifest(directory, Manifest(manifest.format, manifest.identity, files))


def rank_file_of(run_id: str):
    """A damage: the rank file re-saved as another run's (its identity's run id changed)."""

    def damage(path: Path) -> None:
        import torch

        state = torch.load(path, weights_only=True)
        state["checkpoint"]["run_id"] = run_id
        torch.save(state, path)

    return damage


def the_file_of_step_15(path: Path) -> None:
    replace_file(path, path.parents[1] / "step0000015" / path.name)


def damages() -> dict[str, Any]:
    """Damage name → (what it does to a file, what the refusal says of it)."""
    return {
        "same-size": (damage_in_place, "checksum mismatch"),
        "truncated": (truncate, "1000 bytes, "),
        "of step 15": (the_file_of_step_15, "of another checkpoint (step 15 of run "),
        "of another run": (
            rank_file_of("another-run"),
            "of another checkpoint (step 20 of run anoth",
        ),
    }


def build_engine(model_dir: Path, work_dir: Path) -> Any:
    """A one-process DDP engine over the model in ``model_dir``, its work dir ``work_dir``."""
    from conftest import engine_config
    from tango.common import Lazy, Params
    from tango.integrations.torch import Model, TrainConfig, TrainingEngine

    config = TrainConfig("bg", work_dir, devices=[-1], world_size=1, is_distributed=False)
    model = Lazy(Model, Params({"type": "tango_fairscale::causal_lm", "model": str(model_dir)}))
    params = Params(engine_config("tango_fairscale::ddp"))
    return Lazy(TrainingEngine, params).construct(train_config=config, model=model)
