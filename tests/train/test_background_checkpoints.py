"""Checkpoints written by a thread while training goes on (``BackgroundWriter``): the loop does
not wait for the files, the checkpoint holds the state of its step whatever the loop does next, a
failed write stops the run in one line, a run's final checkpoint abandons the write it supersedes.
A kill during a write leaves the previous checkpoint to
resume from: ``tests/integration/train/test_faults.py`` (as do two processes writing in the
background: its 2-process ``fairscale`` runs, killed and resumed)."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch
from helpers.checkpoints import build_engine
from tango.integrations.torch import TrainingEngine

from tango_fairscale.parallel.rank_files import RankFiles
from tango_fairscale.records.checkpoints import LATEST, complete_checkpoints, read_manifest
from tango_fairscale.train.checkpoints import (
    BackgroundWriter,
    CheckpointPolicy,
    TrainingStopped,
    resume,
)


def weights(engine: TrainingEngine) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in engine.model.state_dict().items()}


@pytest.fixture
def writer(tiny_model_dir, tmp_path) -> BackgroundWriter:
    engine = build_engine(tiny_model_dir, tmp_path)
    return BackgroundWriter(engine, CheckpointPolicy(tmp_path / "checkpoints", "run-1"), 30)


def test_the_loop_goes_on_while_the_files_are_written(
    writer, monkeypatch, tmp_path, tiny_model_dir
) -> None:
    """``save`` returns while the write is held; the weights changed after it are not in the
    checkpoint, which is committed once the write ends; the write's seconds are recorded."""
    release, started = threading.Event(), threading.Event()
    write = RankFiles.write

    def held_write(self, snapshot, directory, rank, group=None):
        started.set()
        assert release.wait(30)
        return write(self, snapshot, directory, rank, group)

    monkeypatch.setattr(RankFiles, "write", held_write)
    engine = writer.engine
    before = weights(engine)
    writer.save(5)
    assert started.wait(30) and writer.thread is not None and writer.thread.is_alive()
    with torch.no_grad():  # the loop trains on
        for parameter in engine.model.parameters():
            parameter.add_(1.0)
    assert not (tmp_path / "checkpoints" / LATEST).exists()
    time.sleep(0.2)
    release.set()
    writer.wait()
    assert (tmp_path / "checkpoints" / LATEST).read_text() == "step0000005"
    [written] = writer.write_seconds  # what a synchronous write would have cost the loop
    assert written >= 0.2

    fresh = build_engine(tiny_model_dir, tmp_path / "fresh")
    assert resume(fresh, tmp_path / "checkpoints", True)["step"] == 5
    for name, tensor in weights(fresh).items():
        assert torch.equal(tensor, before[name]), name


def test_a_checkpoint_is_on_the_disk_before_latest_names_it(writer, monkeypatch, tmp_path):
    """Each file the manifest lists, the manifest, the checkpoint's directory (its files' names)
    and the checkpoints directory (its new name) are fsynced before ``latest`` is renamed into
    place: a power loss after that leaves a whole checkpoint, not one its checksums refuse."""
    synced: list[str] = []
    fsync, replace = os.fsync, os.replace

    def recording_fsync(descriptor: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{descriptor}"))
        fsync(descriptor)

    def recording_replace(source, target) -> None:
        if os.path.basename(target) == LATEST:
            synced.append("latest renamed")
        replace(source, target)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "replace", recording_replace)
    writer.save(5, wait=True)
    [checkpoint] = complete_checkpoints(tmp_path / "checkpoints")
    before_latest = synced[: synced.index("latest renamed")]
    partial = str(checkpoint.with_name(".partial-" + checkpoint.name))
    listed = [f"{partial}/{name}" for name in read_manifest(checkpoint).files]
    assert set(listed) | {f"{partial}/manifest.json.tmp", partial} <= set(before_latest)
    assert str(tmp_path / "checkpoints") in before_latest  # after the partial's rename
    assert synced[-1] == str(tmp_path / "checkpoints")  # latest's own name


def test_a_failed_write_stops_the_run_in_one_line(writer, monkeypatch, tmp_path) -> None:
    import errno

    writer.save(5, wait=True)

    def full_disk(self, snapshot, directory, rank, group=None):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(RankFiles, "write", full_disk)
    writer.save(10)
    with pytest.raises(TrainingStopped) as error:
        writer.wait()
    message = str(error.value)
    assert "writing checkpoint step0000010 failed" in message and "No space left" in message
    assert "resume from checkpoint step0000005" in message and "\n" not in message
    assert [path.name for path in complete_checkpoints(tmp_path / "checkpoints")] == ["step0000005"]


def test_the_final_checkpoint_abandons_the_write_it_supersedes(writer, monkeypatch, tmp_path):
    """A write in flight stops at its next file write once the final checkpoint is saved: its
    ``.partial-`` directory goes, no failure is raised, the final checkpoint is committed and
    ``latest``; the checkpoint before stays. Waiting for the write would have taken seconds."""
    from tango_fairscale.records.manifest import HashingFile

    writer.save(3, wait=True)
    write, writing = HashingFile.write, threading.Event()

    def slow_write(self, data):  # step 5's writes take 0.2 s each: a large checkpoint
        if "partial-step0000005" in self._file.name:
            writing.set()
            time.sleep(0.2)
        return write(self, data)

    monkeypatch.setattr(HashingFile, "write", slow_write)
    writer.save(5)
    assert writing.wait(30)
    started = time.perf_counter()
    writer.save(10, model_only=True, supersede=True, wait=True)
    assert time.perf_counter() - started < 2.0
    checkpoints = tmp_path / "checkpoints"
    assert [path.name for path in complete_checkpoints(checkpoints)] == [
        "step0000010",
        "step0000003",
    ]
    assert (checkpoints / LATEST).read_text() == "step0000010"
    assert not any(path.name.startswith(".partial") for path in checkpoints.iterdir())
    assert len(writer.write_seconds) == 2  # steps 3 and 10: the abandoned one is no write
    writer.save(11, supersede=True, wait=True)  # nothing in flight: a plain save
    assert (checkpoints / LATEST).read_text() == "step0000011"


def test_a_model_only_checkpoint_holds_no_optimizer_state_and_exports(writer, tmp_path) -> None:
    """What a finished run writes at its last step: the model and the trainer state without the
    optimizer's, a manifest saying so; it exports to the engine's weights, it does not resume."""
    from tango.common.exceptions import ConfigurationError

    from tango_fairscale.parallel.consolidate import full_state_dict
    from tango_fairscale.records.checkpoints import read_manifest

    writer.save(5, wait=True)  # a step's checkpoint: with the optimizer state
    writer.save(10, wait=True, model_only=True)
    full, final = (tmp_path / "checkpoints" / name for name in ("step0000005", "step0000010"))
    assert not read_manifest(full).model_only and read_manifest(final).model_only
    assert "optimizer" in torch.load(full / "rank0.pt", weights_only=True)
    assert "optimizer" not in torch.load(final / "rank0.pt", weights_only=True)
    expected = weights(writer.engine)
    exported = full_state_dict(final)
    assert exported.keys() == expected.keys()
    assert all(torch.equal(exported[key], expected[key]) for key in expected)
    with pytest.raises(ConfigurationError, match="cannot be resumed"):
        resume(writer.engine, tmp_path / "checkpoints", is_main=True)


def test_the_host_memory_is_reserved_ahead_and_freed_at_the_end(
    writer, monkeypatch, tmp_path, tiny_model_dir
) -> None:
    """``prepare`` reserves the block of the copies on a thread (here the CPU's tensors stand
    for a GPU's), ``save`` copies into it without another allocation, the checkpoint holds the
    step's weights, and ``close`` frees the block."""
    from tango_fairscale.parallel import host_copy
    from tango_fairscale.parallel.host_copy import HostCopier

    writer.copier = HostCopier("cpu")
    allocations = []
    allocate = host_copy._host_block

    def counted(nbytes, pin):
        allocations.append(threading.current_thread().name)
        return allocate(nbytes, pin)

    monkeypatch.setattr(host_copy, "_host_block", counted)
    writer.prepare()
    assert writer.reserving is not None
    writer.save(5, wait=True)
    assert allocations == ["checkpoint-memory"]  # on prepare's thread, once
    block = writer.copier._block
    assert block is not None and block.numel() > 4 * writer.engine.model.num_parameters
    writer.save(6, wait=True)  # the same size: the same block
    assert writer.copier._block is block and len(allocations) == 1
    writer.close()
    assert writer.copier._block is None

    fresh = build_engine(tiny_model_dir, tmp_path / "fresh")
    assert resume(fresh, tmp_path / "checkpoints", True)["step"] == 6
    for name, tensor in weights(fresh).items():
        assert torch.equal(tensor, weights(writer.engine)[name]), name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU's random generator")
def test_a_checkpoint_keeps_the_gpus_random_state(writer, tmp_path) -> None:
    """Dropout on a GPU draws from the device's generator: a resume sets it as it was at the
    checkpoint, so the resumed run draws what the uninterrupted one drew."""
    torch.cuda.manual_seed(7)
    torch.rand(3, device="cuda")
    writer.save(5, wait=True)
    expected = torch.rand(3, device="cuda")
    torch.rand(100, device="cuda")  # training went on
    assert resume(writer.engine, tmp_path / "checkpoints", True)["step"] == 5
    assert torch.equal(torch.rand(3, device="cuda"), expected)
