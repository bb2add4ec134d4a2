"""The training loop's faults, on 2 CPU processes: SIGKILL, SIGTERM, Ctrl-C, a dead or a hung
rank, a damaged rank file of a 2-process checkpoint; a process killed while its background
thread writes a checkpoint.

The faults need runs of their own, in subprocesses; their uninterrupted reference trains with the
other parity runs of its world size (``tests/helpers/parity.py``). The loop's own checks in this
process are ``tests/train/test_loop.py``."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import REPO_ROOT, assert_same_weights, child_processes
from helpers.checkpoints import build_engine, damages
from helpers.parity import RunSpec, define, trains

from tango_fairscale.records.checkpoints import LATEST
from tango_fairscale.train.checkpoints import resume
from tango_fairscale.train.format import ModelFormat

TESTS = REPO_ROOT / "tests"  # on the subprocesses' path: conftest, helpers

TRAIN = """
import sys
sys.path.insert(0, {tests!r})
from pathlib import Path
from conftest import train_tiny
from tango_fairscale.tasks.piqa import read_piqa
train_tiny(Path({workspace!r}), Path({model!r}), read_piqa(Path({piqa!r}), limit=64),
           "tango_fairscale::fairscale", 2, train_steps={steps}, step_options={options!r})
"""


def train_command(
    workspace: Path, model: Path, piqa: Path, steps: int, **step_options: object
) -> list[str]:
    code = TRAIN.format(
        tests=str(TESTS),
        workspace=str(workspace),
        model=str(model),
        piqa=str(piqa),
        steps=steps,
        options=step_options,
    )
    return [sys.executable, "-c", code]


def latest_checkpoint(workspace: Path) -> str | None:
    for latest in workspace.glob("cache/*/work/checkpoints/latest"):
        return latest.read_text().strip()
    return None


STEPS = 20  # the faults strike after the first checkpoint (step 5)

#: ``train_in`` of 2 processes, resuming in each work dir of ``works`` in turn, a line
#: ``=== <work dir>`` on stderr before each.
RESUME = """
import sys
sys.path.insert(0, {tests!r})
from pathlib import Path
from conftest import train_in
from tango_fairscale.tasks.piqa import read_piqa
piqa = read_piqa(Path({piqa!r}), limit=64)
for work in {works!r}:
    print("===", work, file=sys.stderr, flush=True)
    train_in(Path(work), Path({model!r}), piqa, "tango_fairscale::fairscale", 2, {steps})
"""

#: The reference of the fault tests: the same 2-process FairScale run (``train_tiny``'s
#: validation and checkpoints), never interrupted, trained with the other parity runs.
UNINTERRUPTED = define(
    "fairscale/uninterrupted",
    RunSpec("fairscale", 2, train_steps=STEPS, validate_every=10, checkpoint_every=5),
)


@pytest.fixture
def uninterrupted(trained_run):
    return trained_run(UNINTERRUPTED)


def start_and_wait_for_a_checkpoint(command: list[str], workspace: Path) -> subprocess.Popen:
    job = subprocess.Popen(
        command, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 240
    while latest_checkpoint(workspace) is None:
        assert job.poll() is None and time.monotonic() < deadline, "no checkpoint was written"
        time.sleep(0.02)
    return job


def workers_of(pid: int) -> list[int]:
    """Process ids of the training workers started by ``pid`` (children of its fork server)."""
    return [
        worker
        for server in child_processes(pid, b"multiprocessing.forkserver")
        for worker in child_processes(server, b"multiprocessing.forkserver")
    ]


def assert_resumes_to_the_reference(workspace: Path, model: Path, piqa_small, reference) -> None:
    """The same step again (here, not in a subprocess: the same step id, the same workspace)
    resumes from the last checkpoint and ends with the uninterrupted run's weights."""
    from conftest import train_tiny

    stopped_at = latest_checkpoint(workspace)
    assert stopped_at is not None and stopped_at < f"step{STEPS:07d}", stopped_at
    assert not list(workspace.glob("cache/*/work/final_weights.pt"))
    train_tiny(workspace, model, piqa_small, "tango_fairscale::fairscale", 2, train_steps=STEPS)
    resumed = ModelFormat().read(next(workspace.glob("cache/TrainStep-*")))
    assert_same_weights(reference.state_dict(), resumed.state_dict())
    logged = [r["step"] for r in resumed.training_log if "train_loss" in r]
    assert logged == list(range(1, STEPS + 1))
    # The raw log shows the rerun resumed instead of starting over: step 1 was trained once.
    raw = next(workspace.glob("cache/*/work/training_log.jsonl")).read_text().splitlines()
    first_steps = [r for r in map(json.loads, raw) if r["step"] == 1 and "train_loss" in r]
    assert len(first_steps) == 1


@pytest.mark.slow
@trains(UNINTERRUPTED)
def test_sigkill_then_rerun_resumes_and_matches(
    tmp_path, tiny_model_dir, piqa_dir, piqa_small, uninterrupted
) -> None:
    command = train_command(tmp_path, tiny_model_dir, piqa_dir, STEPS)
    job = start_and_wait_for_a_checkpoint(command, tmp_path)
    os.killpg(job.pid, signal.SIGKILL)  # the launcher and both workers, mid-training
    job.communicate()
    assert_resumes_to_the_reference(tmp_path, tiny_model_dir, piqa_small, uninterrupted)


@pytest.mark.slow
@trains(UNINTERRUPTED)
@pytest.mark.parametrize("stop", ["SIGTERM to the launcher", "Ctrl-C"])
def test_sigterm_and_ctrl_c_checkpoint_and_exit_resumably(
    stop, tmp_path, tiny_model_dir, piqa_dir, piqa_small, uninterrupted
) -> None:
    command = train_command(tmp_path, tiny_model_dir, piqa_dir, STEPS)
    job = start_and_wait_for_a_checkpoint(command, tmp_path)
    if stop == "Ctrl-C":  # a terminal sends SIGINT to every process of the foreground group
        os.killpg(job.pid, signal.SIGINT)
        said = "interrupted by SIGINT after step"
    else:  # the launcher passes it on to the workers
        job.send_signal(signal.SIGTERM)
        said = "preempted by SIGTERM after step"
    _, stderr = job.communicate(timeout=120)
    assert job.returncode != 0
    assert said in stderr and "rerun the same command" in stderr, stderr[-2000:]
    stopped_at = latest_checkpoint(tmp_path)
    assert f"resume from checkpoint {stopped_at}" in stderr  # the checkpoint of the last step
    assert_resumes_to_the_reference(tmp_path, tiny_model_dir, piqa_small, uninterrupted)


@pytest.mark.slow
@trains(UNINTERRUPTED)
def test_a_dead_rank_stops_the_others_with_its_name(
    tmp_path, tiny_model_dir, piqa_dir, piqa_small, uninterrupted
) -> None:
    command = train_command(tmp_path, tiny_model_dir, piqa_dir, STEPS)
    job = start_and_wait_for_a_checkpoint(command, tmp_path)
    workers = workers_of(job.pid)
    assert len(workers) == 2
    os.kill(workers[1], signal.SIGKILL)
    started = time.monotonic()
    _, stderr = job.communicate(timeout=120)
    assert time.monotonic() - started < 60  # bounded: no collective waits forever
    assert job.returncode != 0
    assert "died (SIGKILL); the others were stopped" in stderr
    assert not any(Path(f"/proc/{pid}").exists() for pid in workers)  # nothing left behind
    assert_resumes_to_the_reference(tmp_path, tiny_model_dir, piqa_small, uninterrupted)


@pytest.mark.slow
def test_a_hung_rank_makes_the_others_fail_within_the_timeout(
    tmp_path, tiny_model_dir, piqa_dir
) -> None:
    command = train_command(tmp_path, tiny_model_dir, piqa_dir, STEPS, collective_timeout_s=5)
    job = start_and_wait_for_a_checkpoint(command, tmp_path)
    workers = workers_of(job.pid)
    assert len(workers) == 2
    os.kill(workers[1], signal.SIGSTOP)  # alive but stuck: no exit for the launcher to see
    started = time.monotonic()
    try:
        _, stderr = job.communicate(timeout=90)
    finally:
        for pid in workers:  # never leave a stopped process behind, even when the test fails
            if Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGKILL)
    assert time.monotonic() - started < 60
    assert job.returncode != 0
    assert "training process 0 failed" in stderr, stderr[-3000:]
    assert "a collective timed out after 5 s (collective_timeout_s)" in stderr, stderr[-3000:]
    assert not any(Path(f"/proc/{pid}").exists() for pid in workers)


RANK_FILE_DAMAGES = ["same-size", "of step 15"]


@pytest.fixture(scope="module")
def rank_file_reruns(tmp_path_factory, trained_run, tiny_model_dir, piqa_dir) -> dict[str, Any]:
    """For each damage of :data:`RANK_FILE_DAMAGES`, in a copy of the uninterrupted run's
    checkpoints: rank 1's file of the newest checkpoint damaged, then ``export`` of it (its exit
    code and stderr), then the rerun of both ranks (its stderr) — the reruns one after the other
    in one process of their own, whose workers' warnings reach its stderr."""
    import contextlib
    import io
    import shutil

    from tango_fairscale.cli import main

    reference = trained_run(UNINTERRUPTED)
    works, exported = {}, {}
    for damage in RANK_FILE_DAMAGES:
        work = works[damage] = tmp_path_factory.mktemp("damaged-rank-file")
        shutil.copytree(reference.work_dir / "checkpoints", work / "checkpoints")
        damages()[damage][0](work / "checkpoints" / "step0000020" / "rank1.pt")
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(["export", str(work), str(work / "hf")])
        exported[damage] = code, err.getvalue()
    command = RESUME.format(
        tests=str(TESTS),
        works=[str(work) for work in works.values()],
        model=str(tiny_model_dir),
        piqa=str(piqa_dir),
        steps=STEPS,
    )
    resumed = subprocess.run([sys.executable, "-c", command], capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    logs = resumed.stderr.split("=== ")[1:]
    assert [log.split("\n", 1)[0] for log in logs] == [str(work) for work in works.values()]
    return {
        damage: (work, *exported[damage], log)
        for (damage, work), log in zip(works.items(), logs, strict=True)
    }


@pytest.mark.slow
@trains(UNINTERRUPTED)
@pytest.mark.parametrize("damage", RANK_FILE_DAMAGES)
def test_a_damaged_rank_file_of_two_is_refused_and_the_rerun_falls_back(
    damage, rank_file_reruns, uninterrupted
) -> None:
    """Rank 1's file of the newest checkpoint (step 20 of 2 processes) damaged, or taken from
    another checkpoint: export refuses it in one line naming the file; the rerun (both ranks)
    falls back to step 15, says so, and ends with the uninterrupted run's weights."""
    work, code, err, logged = rank_file_reruns[damage]
    problem = damages()[damage][1]
    assert code == 2
    assert err.count("\n") == 1 and "step0000020 is damaged (rank1.pt: " in err, err
    assert problem in err and "export an earlier checkpoint" in err, err
    assert "checkpoint step0000020 is damaged (rank1.pt: " in logged, logged[-2000:]
    assert f"{problem}" in logged and "; resuming from step0000015" in logged, logged[-2000:]
    state = torch.load(work / "final_weights.pt", weights_only=True)
    assert_same_weights(uninterrupted.state_dict(), state)


KILLED_WHILE_WRITING = """
import os, signal, sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
import torch
from tango_fairscale.records.manifest import HashingFile
from tango_fairscale.train.checkpoints import BackgroundWriter, CheckpointPolicy
from helpers.checkpoints import build_engine

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
    tests = str(TESTS)
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
