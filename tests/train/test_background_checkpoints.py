"""Checkpoints written by a thread while training goes on (``BackgroundWriter``): the loop does
not wait for the files, the checkpoint holds the state of its step whatever the loop does next, a
failed write stops the run in one line, and a kill during a write leaves the previous checkpoint
to resume from. (Two processes writing in the background: the 2-process ``fairscale`` runs of
``test_loop.py``, killed and resumed.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import engine_config
from tango.common import Lazy, Params
from tango.integrations.torch import Model, TrainConfig, TrainingEngine

from tango_fairscale.parallel.rank_files import RankFiles
from tango_fairscale.records.checkpoints import LATEST, complete_checkpoints
from tango_fairscale.train.checkpoints import (
    BackgroundWriter,
    CheckpointPolicy,
    TrainingStopped,
    resume,
)


def build_engine(model_dir: Path, work_dir: Path) -> TrainingEngine:
    config = TrainConfig("bg", work_dir, devices=[-1], world_size=1, is_distributed=False)
    model = Lazy(Model, Params({"type": "tango_fairscale::causal_lm", "model": str(model_dir)}))
    params = Params(engine_config("tango_fairscale::ddp"))
    return Lazy(TrainingEngine, params).construct(train_config=config, model=model)


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

    def held_write(self, snapshot, directory, rank):
        started.set()
        assert release.wait(30)
        return write(self, snapshot, directory, rank)

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


def test_a_failed_write_stops_the_run_in_one_line(writer, monkeypatch, tmp_path) -> None:
    import errno

    writer.save(5, wait=True)

    def full_disk(self, snapshot, directory, rank):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(RankFiles, "write", full_disk)
    writer.save(10)
    with pytest.raises(TrainingStopped) as error:
        writer.wait()
    message = str(error.value)
    assert "writing checkpoint step0000010 failed" in message and "No space left" in message
    assert "resume from checkpoint step0000005" in message and "\n" not in message
    assert [path.name for path in complete_checkpoints(tmp_path / "checkpoints")] == ["step0000005"]


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


KILLED_WHILE_WRITING = """
import os, signal, sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
import torch
from tango_fairscale.records.manifest import HashingFile
from tango_fairscale.train.checkpoints import BackgroundWriter, CheckpointPolicy
from train.test_background_checkpoints import build_engine

work = Path({work!r})
engine = build_engine(Path({model!r}), work)
writer = BackgroundWriter(engine, CheckpointPolicy(work / "checkpoints", "run-1"), 30)
writer.save(5, wait=True)
written = 0
write = HashingFile.write
def write_then_die(self, data):
    global written
    written += len(memoryview(data).cast("B"))
    if written > 20_000:  # inside the rank file of step 10
        os.kill(os.getpid(), signal.SIGKILL)
    return write(self, data)
HashingFile.write = write_then_die
with torch.no_grad():
    for parameter in engine.model.parameters():
        parameter.add_(1.0)
writer.save(10)
time.sleep(60)
"""


@pytest.mark.slow  # a fresh interpreter: ~10 s of imports on 2 cores
def test_a_kill_during_a_background_write_leaves_the_previous_checkpoint(
    tiny_model_dir, tmp_path
) -> None:
    tests = str(Path(__file__).resolve().parents[1])
    script = KILLED_WHILE_WRITING.format(tests=tests, work=str(tmp_path), model=str(tiny_model_dir))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests, *sys.path])}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True)
    assert result.returncode == -signal.SIGKILL, result.stderr.decode()[-2000:]
    checkpoints = tmp_path / "checkpoints"
    assert (checkpoints / LATEST).read_text() == "step0000005"
    assert list(checkpoints.glob(".partial-step0000010"))  # the write it was killed in

    engine = build_engine(tiny_model_dir, tmp_path / "resumed")
    assert resume(engine, checkpoints, True)["step"] == 5
    assert not list(checkpoints.glob(".partial-*"))
