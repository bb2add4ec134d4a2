"""The checkpoint formats (``parallel/checkpoint_format.py``, ``rank_files.py``,
``distributed_checkpoint.py``) in one process without a process group: what they write is what
the manifest records (digests taken while writing equal the files read back), every file carries
the checkpoint's identity, a file of another checkpoint is named, a checkpoint loads back, and a
snapshot of an unsharded rank file is the whole model."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from tango.common import Lazy, Params
from tango.common.exceptions import ConfigurationError
from tango.integrations.torch import Model, TrainConfig, TrainingEngine

from tango_fairscale.parallel.checkpoint_format import CheckpointFormat
from tango_fairscale.parallel.consolidate import FORMATS, full_state_dict
from tango_fairscale.parallel.ddp import DDPEngine
from tango_fairscale.parallel.distributed_checkpoint import DistributedCheckpoint
from tango_fairscale.parallel.rank_files import RankFiles
from tango_fairscale.records.checkpoints import (
    MANIFEST,
    DamagedCheckpoint,
    Identity,
    file_record,
    read_manifest,
)

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

IDENTITY = Identity("run-a", 5, 1)


def ddp_engine(work_dir: Path, model_dir: Path) -> DDPEngine:
    """One process's DDP engine (no process group): a plain model and its AdamW."""
    config = TrainConfig("test", work_dir, world_size=1, devices=[-1])
    model = Lazy(Model, Params({"type": "tango_fairscale::causal_lm", "model": str(model_dir)}))
    params = {
        "type": "tango_fairscale::ddp",
        "precision": "32-true",
        "optimizer": {"type": "torch::AdamW"},
    }
    engine = Lazy(TrainingEngine, Params(params)).construct(train_config=config, model=model)
    assert isinstance(engine, DDPEngine)
    return engine


@pytest.fixture
def saved(tmp_path, tiny_model_dir):
    """``saved(format_name)``: (engine, checkpoint directory) of the engine's state saved in it."""

    def save(name: str) -> tuple[DDPEngine, Path]:
        engine = ddp_engine(tmp_path, tiny_model_dir)
        directory = tmp_path / "step0000005"
        FORMATS[name]().save(engine, directory, {"step": 5, "note": "kept"}, IDENTITY)
        return engine, directory

    return save


@pytest.mark.parametrize(
    "name, files",
    [
        ("rank-files", {"rank0.pt"}),
        ("torch-dcp", {".metadata", "__0_0.distcp", "trainer.pt"}),
    ],
)
def test_the_manifest_records_every_file_as_written(name, files, saved) -> None:
    engine, directory = saved(name)
    manifest = read_manifest(directory)
    assert manifest.format == name and manifest.identity == IDENTITY
    on_disk = {
        path.relative_to(directory).as_posix()
        for path in directory.rglob("*")
        if path.is_file() and path.name != MANIFEST
    }
    assert manifest.files.keys() == on_disk
    assert files | {"hf/config.json", "hf/tokenizer.json"} <= on_disk
    for file, record in manifest.files.items():
        assert file_record(directory / file) == record, file  # recorded while writing
    FORMATS[name]().verify(directory, manifest)


@pytest.mark.parametrize("name", ["rank-files", "torch-dcp"])
def test_a_checkpoint_restores_and_consolidates(name, saved, tmp_path, tiny_model_dir) -> None:
    engine, directory = saved(name)
    expected = {key: value.clone() for key, value in engine.wrapped_model.state_dict().items()}
    other = ddp_engine(tmp_path / "other", tiny_model_dir)
    with torch.no_grad():
        for parameter in other.model.parameters():
            parameter.add_(1.0)
    assert FORMATS[name]().restore(other, directory) == {"step": 5, "note": "kept"}
    restored = other.wrapped_model.state_dict()
    assert all(torch.equal(restored[key], value) for key, value in expected.items())
    full = full_state_dict(directory)
    assert all(torch.equal(full[key], value) for key, value in expected.items())


def test_a_snapshot_gives_the_whole_model_where_it_holds_it(tmp_path, tiny_model_dir) -> None:
    """An unsharded rank file's snapshot is the engine's full model state; FairScale's shards
    and DCP's state are not (``None``: the engine gathers the model)."""
    engine = ddp_engine(tmp_path, tiny_model_dir)
    expected = engine.full_model_state()
    assert expected is not None
    snapshot = RankFiles().take(engine, {"step": 5}, IDENTITY, model_only=True)
    whole = RankFiles().full_model_state(snapshot)
    assert whole is not None and whole.keys() == expected.keys()
    assert all(torch.equal(whole[key], value) for key, value in expected.items())
    shards = {**snapshot, "model_metadata": {}, "world_size": 1}  # as FairScale's rank files
    assert RankFiles(sharded=True, reshards=False).full_model_state(shards) is None
    assert RankFiles().full_model_state(None) is None  # another rank of an unsharded engine
    dcp = DistributedCheckpoint()
    assert dcp.full_model_state(dcp.take(engine, {"step": 5}, IDENTITY, model_only=True)) is None


@pytest.mark.parametrize(
    "name, file",
    [("rank-files", "rank0.pt"), ("torch-dcp", "trainer.pt"), ("torch-dcp", ".metadata")],
)
def test_a_file_of_another_checkpoint_is_named(name, file, saved, tmp_path, tiny_model_dir) -> None:
    """The same file of another run's checkpoint of the same step: its own identity tells."""
    _, directory = saved(name)
    other = tmp_path / "other-run"
    engine = ddp_engine(other, tiny_model_dir)
    FORMATS[name]().save(engine, other / "step0000005", {"step": 5}, Identity("run-b", 5, 1))
    shutil.copyfile(other / "step0000005" / file, directory / file)
    with pytest.raises(DamagedCheckpoint) as damage:
        FORMATS[name]().verify(directory, read_manifest(directory))
    assert damage.value.file == file
    assert damage.value.problem == (
        "of another checkpoint (step 5 of run run-b on 1 process; the manifest: step 5 of run "
        "run-a on 1 process)"
    )


def test_a_failed_write_leaves_no_manifest(saved, tmp_path, tiny_model_dir, monkeypatch) -> None:
    import errno

    def full_disk(self, snapshot, directory, rank, group=None):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(RankFiles, "write", full_disk)
    engine = ddp_engine(tmp_path, tiny_model_dir)
    with pytest.raises(OSError, match="No space left on device"):
        RankFiles().save(engine, tmp_path / "partial", {"step": 5}, IDENTITY)
    assert not (tmp_path / "partial" / MANIFEST).exists()


def test_what_a_format_cannot_load_is_refused_in_one_line(saved, tmp_path, tiny_model_dir) -> None:
    engine, directory = saved("rank-files")
    with pytest.raises(ConfigurationError, match="in the 'rank-files' format; this engine reads"):
        DistributedCheckpoint().restore(engine, directory)
    written_by_two = read_manifest(directory)
    written_by_two = type(written_by_two)(
        written_by_two.format, Identity("run-a", 5, 2), written_by_two.files
    )
    fairscale = RankFiles(sharded=True, reshards=False)
    with pytest.raises(ConfigurationError, match="cannot reshard them; resume with device_count=2"):
        fairscale.check_world_size(directory, written_by_two, 1)
    RankFiles().check_world_size(directory, written_by_two, 1)  # rank 0's full state: any count


def test_a_layout_the_engine_does_not_hold_is_refused_in_one_line(
    saved, tmp_path, tiny_model_dir, monkeypatch
) -> None:
    """A sharded engine's bare model on one GPU writes the whole model; on CPUs it shards: a run
    moved between them is refused before anything is loaded, both ways."""
    engine, directory = saved("rank-files")  # the whole model, as the bare model writes it
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    with pytest.raises(ConfigurationError, match="holds the whole model and this engine shards"):
        RankFiles(sharded=True, reshards=False).restore(engine, directory)
    monkeypatch.setattr(type(engine), "model_layout", lambda self: {"model_metadata": {}})
    shards = tmp_path / "shards"
    RankFiles(sharded=True).save(engine, shards, {"step": 5}, IDENTITY)
    with pytest.raises(ConfigurationError, match="holds FairScale's shards and this engine trains"):
        RankFiles().restore(engine, shards)
    assert all(torch.equal(before[k], v) for k, v in engine.model.state_dict().items())
    RankFiles().restore(engine, directory)  # the layout it holds loads


def test_every_format_is_known_to_export() -> None:
    from tango_fairscale.parallel.consolidate import FORMATS as KNOWN

    assert {name: type(fmt()) for name, fmt in KNOWN.items()} == FORMATS
    assert all(issubclass(fmt, CheckpointFormat) for fmt in KNOWN.values())
