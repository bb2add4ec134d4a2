"""A checkpoint rewritten without its optimizer state (``parallel/model_only.py``), in one process:
both formats (rank files, a distributed checkpoint) keep the identity, record the new files in
the manifest, verify, consolidate to the same weights and refuse to resume; a crash while
rewriting leaves the checkpoint as it was. The 2-process checkpoints (FairScale shards, FSDP2's
``.distcp`` files) are exported in ``tests/test_export.py``."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from tango.common.exceptions import ConfigurationError

from tango_fairscale.parallel.consolidate import FORMATS, full_state_dict
from tango_fairscale.parallel.model_only import model_only_checkpoint
from tango_fairscale.parallel.rank_files import RankFiles
from tango_fairscale.parallel.safe_load import read_dcp_metadata
from tango_fairscale.records.checkpoints import (
    CheckpointError,
    Identity,
    clear_partials,
    complete_checkpoints,
    file_record,
    read_manifest,
)

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

IDENTITY = Identity("run-a", 5, 1)


@pytest.fixture
def stepped(tmp_path, tiny_model_dir):
    """``stepped(format_name)``: (engine, checkpoint) of a one-process DDP engine saved after one
    AdamW step, so that the optimizer holds state."""
    from test_checkpoint_formats import ddp_engine

    def save(name: str):
        engine = ddp_engine(tmp_path, tiny_model_dir)
        loss = sum(parameter.square().sum() for parameter in engine.model.parameters())
        loss.backward()
        engine.optimizer.step()
        directory = tmp_path / "checkpoints" / "step0000005"
        FORMATS[name]().save(engine, directory, {"step": 5}, IDENTITY)
        return engine, directory

    return save


def optimizer_entries(directory: Path, name: str) -> list[str]:
    """What of the optimizer's state a checkpoint holds: rank 0's ``optimizer`` entry, or the
    distributed checkpoint's ``optimizer.`` keys."""
    if name == "rank-files":
        state = torch.load(directory / "rank0.pt", weights_only=True)
        return list(state.get("optimizer", {}).get("state", {}))
    metadata = read_dcp_metadata((directory / ".metadata").read_bytes())
    return [key for key in metadata.state_dict_metadata if key.startswith("optimizer.")]


@pytest.mark.parametrize("name", ["rank-files", "torch-dcp"])
def test_a_model_only_checkpoint_verifies_and_holds_the_same_model(name, stepped) -> None:
    engine, directory = stepped(name)
    before = read_manifest(directory)
    expected = full_state_dict(directory)
    assert optimizer_entries(directory, name)
    size = sum(record.size for record in before.files.values())

    assert model_only_checkpoint(directory) == directory
    after = read_manifest(directory)
    assert after.model_only and not before.model_only
    assert (after.format, after.identity) == (before.format, before.identity)
    on_disk = {
        path.relative_to(directory).as_posix()
        for path in directory.rglob("*")
        if path.is_file() and path.name != "manifest.json"
    }
    assert after.files.keys() == on_disk
    for file, record in after.files.items():
        assert file_record(directory / file) == record, file
    FORMATS[name]().verify(directory, after)
    assert optimizer_entries(directory, name) == []
    assert sum(record.size for record in after.files.values()) < size / 2  # AdamW: 2 x the model
    state = full_state_dict(directory)
    assert state.keys() == expected.keys()
    assert all(torch.equal(state[key], value) for key, value in expected.items())
    assert not list(directory.parent.glob(".partial-*"))
    assert model_only_checkpoint(directory) == directory  # nothing left to drop
    assert read_manifest(directory) == after


@pytest.mark.parametrize("name", ["rank-files", "torch-dcp"])
def test_a_model_only_checkpoint_does_not_resume(name, stepped, tmp_path, tiny_model_dir) -> None:
    from test_checkpoint_formats import ddp_engine

    _, directory = stepped(name)
    model_only_checkpoint(directory)
    other = ddp_engine(tmp_path / "other", tiny_model_dir)
    with pytest.raises(CheckpointError, match="without the optimizer state .* cannot be resumed"):
        FORMATS[name]().restore(other, directory)


@pytest.mark.parametrize(
    ("name", "method"),
    [("rank-files", "write_model_only"), ("torch-dcp", "write_model_only"), ("torch-dcp", "hf")],
)
def test_a_failed_rewrite_leaves_the_checkpoint_as_it_was(
    name, method, stepped, monkeypatch
) -> None:
    """The disk fills while the copy is written (its format's files, or the hf files after
    them): the checkpoint keeps its files and manifest, the copy is removed."""
    import errno

    _, directory = stepped(name)
    before = read_manifest(directory)
    files = {path: path.read_bytes() for path in directory.rglob("*") if path.is_file()}
    format_class = FORMATS[name]
    if method == "hf":
        copy = shutil.copyfile

        def full_disk(source, target, *args, **kwargs):
            if "/hf/" in str(target):
                raise OSError(errno.ENOSPC, "No space left on device")
            return copy(source, target, *args, **kwargs)

        monkeypatch.setattr(shutil, "copyfile", full_disk)
    else:
        write = getattr(format_class, method)

        def full_disk(self, source, manifest, target):
            write(self, source, manifest, target)  # the files are written, then the disk fills
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(format_class, method, full_disk)
    with pytest.raises(OSError, match="No space left on device"):
        model_only_checkpoint(directory)
    assert read_manifest(directory) == before
    assert {path: path.read_bytes() for path in directory.rglob("*") if path.is_file()} == files
    assert not list(directory.parent.glob(".partial-*"))
    assert optimizer_entries(directory, name)


def test_a_crash_while_rewriting_never_leaves_a_checkpoint_that_loads_wrongly(
    stepped, tmp_path, monkeypatch
) -> None:
    """Killed while the copy is written (its files half there, no manifest), then between the
    two renames that swap it in: what is listed is always a complete checkpoint, the old one
    or the copy; the copy and the one set aside are ``.partial-`` directories, never listed; when
    a run starts (``clear_partials``) the copy is removed and the one set aside put back."""
    _, directory = stepped("rank-files")
    expected = full_state_dict(directory)
    checkpoints = directory.parent

    class Killed(BaseException):
        pass

    write = RankFiles.write_model_only

    def killed_midway(self, source, manifest, target):
        write(self, source, manifest, target)
        (target / "rank0.pt").write_bytes((target / "rank0.pt").read_bytes()[:1000])
        raise Killed  # the process dies: no cleanup of the copy (it is left half-written)

    monkeypatch.setattr(RankFiles, "write_model_only", killed_midway)
    monkeypatch.setattr(shutil, "rmtree", lambda *args, **kwargs: None)  # a kill runs nothing
    with pytest.raises(Killed):
        model_only_checkpoint(directory)
    monkeypatch.undo()
    assert (checkpoints / ".partial-step0000005" / "rank0.pt").is_file()
    assert complete_checkpoints(checkpoints) == [directory]
    assert not read_manifest(directory).model_only
    state = full_state_dict(directory)  # the checkpoint as it was: verified
    assert all(torch.equal(state[key], value) for key, value in expected.items())

    # Killed between setting the old one aside and renaming the copy into place.
    replace = os.replace

    def killed_at_the_second_rename(source, target):
        if Path(source).name == ".partial-step0000005":
            raise Killed
        return replace(source, target)

    monkeypatch.setattr(os, "replace", killed_at_the_second_rename)
    with pytest.raises(Killed):
        model_only_checkpoint(directory)
    monkeypatch.undo()
    assert complete_checkpoints(checkpoints) == []  # neither is listed: a rerun cannot load it
    assert read_manifest(checkpoints / ".partial-step0000005").model_only  # the complete copy
    assert not read_manifest(checkpoints / ".partial-replaced-step0000005").model_only
    clear_partials(checkpoints)  # a run starting: the one set aside is put back
    assert complete_checkpoints(checkpoints) == [directory]
    assert not read_manifest(directory).model_only
    assert [path.name for path in checkpoints.glob(".partial-*")] == []


def test_a_damaged_checkpoint_is_not_rewritten(stepped) -> None:
    from helpers.checkpoints import damage_in_place

    _, directory = stepped("rank-files")
    damage_in_place(directory / "rank0.pt")
    with pytest.raises(CheckpointError, match=r"is damaged \(rank0.pt: checksum mismatch\)"):
        model_only_checkpoint(directory)
    assert not read_manifest(directory).model_only
    assert not list(directory.parent.glob(".partial-*"))


def test_resuming_from_a_model_only_checkpoint_is_refused_in_one_line(
    stepped, tmp_path, tiny_model_dir, piqa_small
) -> None:
    """The training loop itself (not the step, which consolidates a finished run's checkpoint
    instead of resuming): one line naming the checkpoint and what to do."""
    from conftest import train_in

    _, directory = stepped("rank-files")
    model_only_checkpoint(directory)
    work = tmp_path / "checkpoints"
    with pytest.raises(ConfigurationError) as error:
        train_in(tmp_path, tiny_model_dir, piqa_small, "tango_fairscale::ddp", 1, 10)
    message = str(error.value)
    assert "\n" not in message and f"checkpoint {directory} cannot be loaded" in message
    assert "it exports, it cannot be resumed" in message and f"delete {work}" in message
