"""The training loop: crash safety and resumption, on 2 CPU processes.

The faults (SIGKILL, SIGTERM, a dead or hung rank) need runs of their own, in subprocesses (slow
tier); their uninterrupted reference and the speed-option and bf16 parity runs train with the
other parity runs of their world size (``tests/helpers/parity.py``)."""

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import assert_same_run, assert_same_weights, child_processes
from helpers.parity import DDP, RunSpec, define, run_param, trains
from helpers.parity import STEPS as PARITY_STEPS

from tango_fairscale.model.causal_lm import ModelWrapper
from tango_fairscale.train.format import ModelFormat

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
        tests=str(Path(__file__).parents[1]),
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


def test_a_non_finite_loss_stops_training_and_keeps_the_last_checkpoint(
    tmp_path, tiny_model_dir, piqa_small
) -> None:
    from conftest import train_in

    from tango_fairscale.train.guards import NonFiniteLossError

    # lr 1e6 drives an fp32 run to inf/NaN within a few steps.
    with pytest.raises(NonFiniteLossError) as error:
        train_in(
            tmp_path,
            tiny_model_dir,
            piqa_small,
            "tango_fairscale::ddp",
            1,
            20,
            optimizer={"type": "torch::AdamW", "lr": 1e6},
            max_grad_norm=None,
        )
    message = str(error.value)
    assert "non-finite loss at step" in message and "training examples" in message
    assert "\n" not in message
    first_bad = int(message.split("non-finite loss at step ")[1].split()[0])
    latest = tmp_path / "checkpoints" / "latest"
    if first_bad > 5:  # a checkpoint from before the failure exists and is intact
        assert int(latest.read_text()[4:]) < first_bad
    else:
        assert not latest.exists()
    assert not (tmp_path / "final_weights.pt").exists()


@pytest.mark.parametrize(
    "scaled, losses, fails_at",
    [
        (False, [1.0, 1.0, float("nan"), 1.0], 3),
        (True, [1.0] + [float("inf")] * 10 + [1.0], None),  # the scaler skips up to 10 in a row
        (True, [1.0] + [float("nan")] * 11 + [1.0], 2),
    ],
)
def test_non_finite_guard(scaled, losses, fails_at) -> None:
    """The guard raises on the step the run breaks (naming the first bad step), not later."""
    from tango_fairscale.data.schedules import BatchSchedule
    from tango_fairscale.train.guards import NonFiniteGuard, NonFiniteLossError

    guard = NonFiniteGuard(scaled, BatchSchedule(100, 4, seed=0).global_batch, vocab_size=1000)
    breaks_at = None if fails_at is None else fails_at + guard.bound
    for step, loss in enumerate(losses, start=1):
        if step == breaks_at:
            with pytest.raises(NonFiniteLossError, match=f"at step {fails_at} "):
                guard.observe(step, loss)
            return
        guard.observe(step, loss)
    assert fails_at is None


class Payload:
    """Unpickling this runs ``touch MARKER``: what a malicious checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


#: ``train_in``'s first 5 steps (one process), whose checkpoint the damage tests damage.
FIVE_STEPS = define(
    "ddp/five-steps-one-process",
    RunSpec("ddp", 1, train_steps=5, checkpoint_every=5, validate=False),
)


@trains(FIVE_STEPS)
@pytest.mark.parametrize(
    "damage", ["truncated", "malicious", "wrong-shape", "forged-malicious", "forged-wrong-shape"]
)
def test_a_damaged_checkpoint_is_refused_in_one_line(
    damage, trained_run, tmp_path, tiny_model_dir, piqa_small
) -> None:
    """With no earlier checkpoint to fall back to. ``forged-``: the manifest rewritten to match
    the files, so that the loaders themselves refuse them."""
    import shutil

    from conftest import train_in
    from helpers.checkpoints import reseal
    from tango.common.exceptions import ConfigurationError

    from tango_fairscale.model.causal_lm import ModelWrapper

    shutil.copytree(trained_run(FIVE_STEPS).work_dir / "checkpoints", tmp_path / "checkpoints")
    state_file = tmp_path / "checkpoints" / "step0000005" / "rank0.pt"
    marker = tmp_path / "payload-ran"
    if damage == "truncated":
        state_file.write_bytes(state_file.read_bytes()[:1000])
    elif damage.endswith("malicious"):
        torch.save({"model": Payload(marker)}, state_file)
    else:  # a checkpoint of another model: wider embeddings
        other = tmp_path / "other-model"
        from conftest import save_tiny_gpt2, shared_data_dir

        save_tiny_gpt2(other, shared_data_dir() / "gpt2-tokenizer", n_embd=64)
        state = torch.load(state_file, weights_only=True)
        state["model"] = ModelWrapper(str(other)).state_dict()
        torch.save(state, state_file)
    if damage.startswith("forged"):
        reseal(state_file.parent)
    with pytest.raises(ConfigurationError) as error:
        train_in(tmp_path, tiny_model_dir, piqa_small, "tango_fairscale::ddp", 1, 10)
    message = str(error.value)
    assert "\n" not in message
    assert f"checkpoint {state_file.parent} cannot be loaded" in message
    if not damage.startswith("forged"):
        assert "(rank0.pt: " in message and "it is damaged" in message
    assert not marker.exists()  # the payload never ran


@trains(FIVE_STEPS)
def test_a_checkpoint_without_manifest_is_refused_in_one_line(
    trained_run, tmp_path, tiny_model_dir, piqa_small
) -> None:
    """A checkpoint written before checkpoints carried a manifest: nothing can verify it."""
    import shutil

    from conftest import train_in
    from tango.common.exceptions import ConfigurationError

    shutil.copytree(trained_run(FIVE_STEPS).work_dir / "checkpoints", tmp_path / "checkpoints")
    (tmp_path / "checkpoints" / "step0000005" / "manifest.json").unlink(missing_ok=True)
    with pytest.raises(ConfigurationError) as error:
        train_in(tmp_path, tiny_model_dir, piqa_small, "tango_fairscale::ddp", 1, 10)
    message = str(error.value)
    assert "\n" not in message and "step0000005 has no manifest" in message
    assert f"delete {tmp_path / 'checkpoints'} to start this step over" in message


def fallback_run(engine: str) -> str:
    """20 steps on one process, as ``train_in`` runs them (checkpoints every 5, validation every
    10), keeping the default 2 checkpoints: steps 15 and 20."""
    spec = RunSpec(engine, 1, train_steps=20, validate_every=10, checkpoint_every=5)
    return define(f"{engine}/20-steps-one-process", spec)


FALLBACK = {engine: fallback_run(engine) for engine in ("fairscale", "fsdp2")}


def rank_file_of(run_id: str):
    """A damage: the rank file re-saved as another run's (its identity's run id changed)."""

    def damage(path: Path) -> None:
        state = torch.load(path, weights_only=True)
        state["checkpoint"]["run_id"] = run_id
        torch.save(state, path)

    return damage


def the_file_of_step_15(path: Path) -> None:
    from helpers.checkpoints import replace_file

    replace_file(path, path.parents[1] / "step0000015" / path.name)


def damages() -> dict[str, Any]:
    from helpers.checkpoints import damage_in_place, truncate

    return {
        "same-size": (damage_in_place, "checksum mismatch"),
        "truncated": (truncate, "1000 bytes, "),
        "of step 15": (the_file_of_step_15, "of another checkpoint (step 15 of run "),
        "of another run": (
            rank_file_of("another-run"),
            "of another checkpoint (step 20 of run anoth",
        ),
    }


@pytest.mark.parametrize(
    "engine, file, damage",
    [
        pytest.param(engine, file, damage, marks=trains(FALLBACK[engine]))
        for engine, file, damage in [
            ("fairscale", "rank0.pt", "same-size"),
            ("fairscale", "rank0.pt", "of step 15"),
            ("fairscale", "rank0.pt", "of another run"),
            ("fsdp2", "__0_0.distcp", "same-size"),
            ("fsdp2", "__0_0.distcp", "truncated"),
            ("fsdp2", "trainer.pt", "same-size"),
        ]
    ],
)
def test_a_damaged_checkpoint_falls_back_to_the_one_before(
    engine, file, damage, trained_run, tmp_path, tiny_model_dir, piqa_small, caplog
) -> None:
    """The newest checkpoint (step 20) damaged: the rerun says so, resumes from step 15 and ends
    with the uninterrupted run's weights."""
    import shutil

    from conftest import train_in

    reference = trained_run(FALLBACK[engine])
    shutil.copytree(reference.work_dir / "checkpoints", tmp_path / "checkpoints")
    kept = sorted(path.name for path in (tmp_path / "checkpoints").glob("step*"))
    do, problem = damages()[damage]
    do(tmp_path / "checkpoints" / "step0000020" / file)
    with caplog.at_level(logging.WARNING):
        train_in(tmp_path, tiny_model_dir, piqa_small, f"tango_fairscale::{engine}", 1, 20)
    said = [r.getMessage() for r in caplog.records if "is damaged" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(f"checkpoint step0000020 is damaged ({file}: ")
    assert problem in said[0] and said[0].endswith("; resuming from step0000015"), said
    state = torch.load(tmp_path / "final_weights.pt", weights_only=True)
    assert_same_weights(reference.state_dict(), state)
    raw = (tmp_path / "training_log.jsonl").read_text().splitlines()
    assert [r["step"] for r in map(json.loads, raw) if "train_loss" in r] == list(range(16, 21))
    assert kept == ["step0000015", "step0000020"]  # keep_checkpoints' default: 2


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
        tests=str(Path(__file__).parents[1]),
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


def test_keep_checkpoints_keeps_the_newest(
    tmp_path, tiny_model_dir, piqa_small, monkeypatch
) -> None:
    """Checkpoints every 5 of 20 steps, ``keep_checkpoints: 3``: steps 10, 15 and 20 stay while
    the run trains (once it finished, the step keeps the last alone: ``tests/train/
    test_step.py``, here kept from running). The setting is not part of the cache key."""
    from conftest import train_tiny

    import tango_fairscale.train.step as step_module

    monkeypatch.setattr(step_module, "give_back_work_dir", lambda *args: None)
    train_tiny(tmp_path, tiny_model_dir, piqa_small, step_options={"keep_checkpoints": 3})
    [checkpoints] = tmp_path.glob("cache/*/work/checkpoints")
    kept = sorted(path.name for path in checkpoints.glob("step*"))
    assert kept == ["step0000010", "step0000015", "step0000020"]
    assert (checkpoints / "latest").read_text() == "step0000020"
    assert not list(checkpoints.glob(".partial-*"))
    # The same step with another keep_checkpoints: already done, nothing trains.
    train_tiny(tmp_path, tiny_model_dir, piqa_small, step_options={"keep_checkpoints": 1})
    assert sorted(path.name for path in checkpoints.glob("step*")) == kept


@pytest.mark.slow
def test_a_full_disk_keeps_the_previous_checkpoint(
    tmp_path, tiny_model_dir, piqa_small, monkeypatch
) -> None:
    import errno

    from conftest import train_in

    from tango_fairscale.train.checkpoints import TrainingStopped

    save = torch.save

    def save_until_the_disk_is_full(obj, path, *args, **kwargs):
        if "step0000010" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device")
        return save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save_until_the_disk_is_full)
    with pytest.raises(TrainingStopped) as error:
        train_in(tmp_path, tiny_model_dir, piqa_small, "tango_fairscale::ddp", 1, 20)
    message = str(error.value)
    assert "writing checkpoint step0000010 failed" in message and "No space left" in message
    assert "resume from checkpoint step0000005" in message and "\n" not in message
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step0000005"

    monkeypatch.setattr(torch, "save", save)  # space again: the rerun resumes at step 5
    train_in(tmp_path, tiny_model_dir, piqa_small, "tango_fairscale::ddp", 1, 20)
    raw = (tmp_path / "training_log.jsonl").read_text().splitlines()
    steps = [r["step"] for r in map(json.loads, raw) if "train_loss" in r]
    assert steps.count(5) == 1 and steps.count(6) == 2 and steps[-1] == 20
    assert not list((tmp_path / "checkpoints").glob(".partial-*"))


FUSED_ADAMW = {"optimizer": {"type": "torch::AdamW", "lr": 1e-3, "fused": True}}


def speed_run(engine: str, option: str) -> str:
    """``packed``: packed micro-batches and validation; ``fused``: fused AdamW, checkpointed
    half-way (its state saved mid-run and the run going on)."""
    if option == "packed":
        spec = RunSpec(engine, 2, pack_sequences=True)
    else:
        spec = RunSpec(engine, 2, checkpoint_every=PARITY_STEPS // 2, engine_params=FUSED_ADAMW)
    return define(f"{engine}/{option}", spec)


@pytest.mark.parametrize(
    "run",
    [
        run_param(name, name, DDP, id=name.replace("/", "-"), slow=name != "ddp/packed")
        for name in [
            speed_run("ddp", "packed"),
            speed_run("fairscale", "packed"),
            speed_run("fsdp2", "packed"),
            speed_run("fairscale", "fused"),
            speed_run("fsdp2", "fused"),
        ]
    ],
)
def test_speed_options_reproduce_ddp(run, trained_run) -> None:
    """Options for speed, not results, on 2 processes reproduce padded DDP with torch's default
    AdamW (losses, weights, accuracies): ``pack_sequences`` (packed micro-batches and packed
    validation) through every engine that takes them, and fused AdamW (docs/ENGINES.md
    recommends it on GPUs) stepping FairScale's flat parameters and FSDP2's sharded ones in one
    kernel, through a checkpoint written half-way."""
    assert_same_run(trained_run(DDP), trained_run(run))


def test_packing_with_the_pipe_engine_is_refused(tmp_path, tiny_model_dir, piqa_small) -> None:
    from conftest import train_tiny
    from tango.common.exceptions import ConfigurationError

    with pytest.raises(ConfigurationError, match="pack_sequences needs an engine .* set pack_seq"):
        train_tiny(
            tmp_path,
            tiny_model_dir,
            piqa_small,
            "tango_fairscale::pipe",
            step_options={"pack_sequences": True},
            pipe={"balance": [1, 1], "chunks": 2, "devices": ["cpu", "cpu"]},
        )


BF16 = {"precision": "bf16-mixed"}
DDP_BF16 = define("ddp/bf16-mixed", RunSpec("ddp", 2, engine_params=BF16))


@pytest.mark.slow
@pytest.mark.parametrize(
    "run",
    [
        run_param(name, name, DDP_BF16, id=engine)
        for engine in ("fairscale", "fsdp2")
        for name in [
            define(
                f"{engine}/bf16-mixed",
                RunSpec(
                    engine,
                    2,
                    engine_params={**BF16, "sharding": {"activation_checkpointing": True}},
                ),
            )
        ]
    ],
)
def test_bf16_mixed_sharded_training_follows_ddp_autocast(run, trained_run, tiny_model_dir) -> None:
    """``bf16-mixed`` under sharding (bf16 compute, fp32 master weights and gradient reduction;
    checkpointed units) on 2 processes tracks DDP under bf16 autocast to bf16's rounding (measured:
    losses within 3e-5 relative, the models 0.8 % of the distance trained apart), and the
    consolidated weights are the fp32 masters."""
    trained, ddp_bf16_reference = trained_run(run), trained_run(DDP_BF16)
    losses = [r["train_loss"] for r in trained.training_log if "train_loss" in r]
    reference = [r["train_loss"] for r in ddp_bf16_reference.training_log if "train_loss" in r]
    assert len(losses) == len(reference) == 10
    assert losses == pytest.approx(reference, rel=1e-3)
    # Adam's steps are about lr each whatever the gradient, so bf16's rounding moves single
    # weights by up to a few steps: compare the whole model's distance to DDP's with how far
    # DDP's training moved it.
    start = ModelWrapper(str(tiny_model_dir)).state_dict()
    expected = ddp_bf16_reference.state_dict()
    state = trained.state_dict()
    assert all(value.dtype == torch.float32 for value in state.values())
    apart = sum(float((state[k] - expected[k]).square().sum()) for k in expected) ** 0.5
    moved = sum(float((expected[k] - start[k]).square().sum()) for k in expected) ** 0.5
    assert apart < 0.05 * moved, (apart, moved)
