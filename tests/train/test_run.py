"""One process's training run (``train/run.py``), piece by piece, in this process: the DDP engine
over the tiny GPT-2 on the CPU (no process group), no optimizer step taken.

What the loop asks of a :class:`TrainingRun` at each step: its micro-batches (a pure function of
the seed and the step), which steps log, validate and checkpoint, the log record, a checkpoint it
resumes from, the preemption that stops it resumably, and the final weights it hands back."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from tango.common import Lazy, Params
from tango.integrations.torch import Model, TrainConfig, TrainingEngine

from tango_fairscale.records.run_info import RunInfo
from tango_fairscale.records.training_log import read_training_log
from tango_fairscale.tasks.lm_eval import TaskSpec, load_tasks
from tango_fairscale.tasks.training_pairs import training_pairs
from tango_fairscale.train.checkpoints import TrainingStopped
from tango_fairscale.train.loop import TrainPlan, build_engine
from tango_fairscale.train.run import (
    StepLoss,
    TrainingRun,
    hand_over,
    write_run_info,
)
from tango_fairscale.train.validation import first_metric

BATCH_SIZE = 8


def make_plan(
    work_dir: Path,
    model_dir: Path,
    pairs: list[tuple[str, str]],
    validate_tasks: list[TaskSpec] | None = None,
    *,
    seed: int = 1,
    grad_accum: int = 1,
    train_steps: int = 10,
    log_every: int = 4,
    checkpoint_every: int = 3,
    validate_every: int | None = None,
    **plan_options: Any,
) -> TrainPlan:
    """A one-process plan of the DDP engine (every ``TrainPlan`` of this file is made here;
    ``plan_options``: its fields, and its runtime block's)."""
    from conftest import engine_config, with_runtime

    config = TrainConfig(
        "run",
        work_dir,
        seed=seed,
        train_steps=train_steps,
        grad_accum=grad_accum,
        log_every=log_every,
        checkpoint_every=checkpoint_every,
        validate_every=validate_every,
        devices=[-1],
        world_size=1,
    )
    model = Lazy(Model, Params({"type": "tango_fairscale::causal_lm", "model": str(model_dir)}))
    engine = Lazy(TrainingEngine, Params(engine_config("tango_fairscale::ddp")))
    options = with_runtime({"eval_batch_size": 16, "defer_checkpoints": False, **plan_options})
    return TrainPlan(config, model, engine, pairs, validate_tasks or [], BATCH_SIZE, **options)


@pytest.fixture(scope="module")
def pairs(piqa_small: Any) -> list[tuple[str, str]]:
    task = TaskSpec(name="piqa", dataset=piqa_small)
    loaded = load_tasks(task, training=True)["tasks"]["piqa"]
    return training_pairs(loaded, "piqa")[:24]  # 3 steps an epoch


@pytest.fixture
def runs() -> Iterator[list[TrainingRun]]:
    """Every run a test makes (add it here): their signal handlers restored, their writes ended."""
    made: list[TrainingRun] = []
    yield made
    for run in reversed(made):  # each restores the handlers it found: the latest first
        run.preemption.restore()
        run.writer.settle()


def start(plan: TrainPlan, runs: list[TrainingRun], engine: Any = None) -> TrainingRun:
    run = TrainingRun(engine or build_engine(plan), plan)
    runs.append(run)
    return run


def one_step_run(tmp_path: Path, model_dir: Path, pairs: list, runs: list) -> TrainingRun:
    """A run of one step, stepped and logged, whose model ``finish`` returns."""
    plan = make_plan(tmp_path, model_dir, pairs, train_steps=1, final_weights_to_file=False)
    run = start(plan, runs)
    run.stepped(0, torch.tensor(2.0), run.batches(0), [])
    run.log_step(1, torch.tensor(2.0), 1e-3, [])
    return run


def test_a_steps_batches_depend_on_the_seed_and_the_step_only(
    tmp_path: Path, tiny_model_dir: Path, pairs: list, runs: list
) -> None:
    plan = make_plan(tmp_path, tiny_model_dir, pairs, grad_accum=2)
    run = start(plan, runs)
    assert run.schedule.steps_per_epoch == len(pairs) // BATCH_SIZE == 3
    assert [run.epoch(step) for step in range(7)] == [0, 0, 0, 1, 1, 1, 2]
    batches = run.batches(4)
    assert len(batches) == 2  # grad_accum micro-batches of half the batch each
    assert all(batch["input_ids"].shape[0] == BATCH_SIZE // 2 for batch in batches)
    again = start(plan, runs, run.engine).batches(4)  # another run of the same plan
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(batches, again))
    # Another step or another seed: other examples.
    assert not torch.equal(run.batches(5)[0]["input_ids"], batches[0]["input_ids"])
    other_seed = make_plan(tmp_path / "seed", tiny_model_dir, pairs, seed=2, grad_accum=2)
    other = start(other_seed, runs, run.engine).batches(4)
    assert not all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(batches, other))


def test_packed_runs_pack_their_batches(
    tmp_path: Path, tiny_model_dir: Path, pairs: list, runs: list
) -> None:
    plain = start(make_plan(tmp_path / "plain", tiny_model_dir, pairs), runs)
    packed_plan = make_plan(tmp_path / "packed", tiny_model_dir, pairs, pack_sequences=True)
    packed = start(packed_plan, runs, plain.engine)
    unpacked, (batch,) = plain.batches(0)[0], packed.batches(0)
    assert unpacked["input_ids"].shape[0] == BATCH_SIZE
    assert batch["input_ids"].shape[0] < BATCH_SIZE  # several queries share a row
    real = int((unpacked["labels"] != -100).sum())
    assert int((batch["labels"] != -100).sum()) == real  # the same targets


def test_a_checkpoint_due_during_a_write_waits_for_the_step_after_it(
    tmp_path: Path, tiny_model_dir: Path, pairs: list, runs: list, monkeypatch
) -> None:
    """``defer_checkpoints`` (the default): the cadence's checkpoint at step 3 waits while the
    previous write is in flight and is taken at the first step after; the last step's and a
    stop's never wait; off, exactly at the cadence."""
    from tango_fairscale.train.checkpoints import BackgroundWriter

    run = start(make_plan(tmp_path / "a", tiny_model_dir, pairs, defer_checkpoints=True), runs)
    writing = [True]
    monkeypatch.setattr(BackgroundWriter, "busy", property(lambda self: writing[0]))
    assert [run.wants_checkpoint(done, False) for done in (1, 2, 3, 4, 5)] == [False] * 5
    assert run.wants_checkpoint(10, False) and run.wants_checkpoint(5, True)  # last, stop
    writing[0] = False
    assert run.wants_checkpoint(5, False)  # step 3's, now
    run.checkpoint_due = False  # as checkpoint() leaves it
    assert not run.wants_checkpoint(7, False)
    exact = start(make_plan(tmp_path / "b", tiny_model_dir, pairs), runs)
    writing[0] = True
    assert [done for done in range(1, 11) if exact.wants_checkpoint(done, False)] == [3, 6, 9, 10]


def test_which_steps_log_checkpoint_and_validate(
    tmp_path: Path, tiny_model_dir: Path, pairs: list, piqa_small: Any, runs: list
) -> None:
    run = start(make_plan(tmp_path / "a", tiny_model_dir, pairs), runs)
    steps = range(1, 11)  # train_steps 10, log_every 4, checkpoint_every 3
    assert [done for done in steps if run.is_checkpoint_step(done)] == [3, 6, 9, 10]
    # The first step, every log_every-th and every checkpoint's.
    assert [done for done in steps if run.is_log_step(done)] == [1, 3, 4, 6, 8, 9, 10]
    assert not any(run.is_validation_step(done) for done in steps)  # nothing to validate
    task = TaskSpec(name="piqa", dataset=piqa_small, limit=4)
    plan = make_plan(tmp_path / "b", tiny_model_dir, pairs, [task], validate_every=4)
    validating = start(plan, runs, run.engine)
    assert [done for done in steps if validating.is_validation_step(done)] == [4, 8, 10]
    plan = make_plan(tmp_path / "c", tiny_model_dir, pairs, [task], validate_every=None)
    only_last = start(plan, runs, run.engine)
    assert [done for done in steps if only_last.is_validation_step(done)] == [10]


def test_a_log_step_writes_the_loss_rate_and_throughput(
    tmp_path: Path, tiny_model_dir: Path, pairs: list, runs: list
) -> None:
    run = start(make_plan(tmp_path, tiny_model_dir, pairs), runs)
    batches = run.batches(0)
    run.stepped(0, torch.tensor(2.5), batches, [])
    run.check_previous_loss()
    run.log_step(1, torch.tensor(2.5), 1e-3, [])
    (record,) = read_training_log(tmp_path / "training_log.jsonl")
    assert record["step"] == 1 and record["train_loss"] == 2.5 and record["lr"] == 1e-3
    tokens = sum(int((b["labels"] != -100).sum()) for b in batches)
    assert tokens > 0 and record["tokens_per_s"] > 0
    info = RunInfo.read(tmp_path / "run_info.json")  # written when the run started
    assert (info.world_size, info.global_batch, info.engine) == (1, BATCH_SIZE, "DDPEngine")


def test_a_non_finite_loss_stops_the_run_at_the_next_step(
    tmp_path: Path, tiny_model_dir: Path, pairs: list, runs: list
) -> None:
    from tango_fairscale.train.guards import NonFiniteLossError

    run = start(make_plan(tmp_path, tiny_model_dir, pairs), runs)
    run.stepped(0, torch.tensor(float("nan")), run.batches(0), [])
    with pytest.raises(NonFiniteLossError):
        run.check_previous_loss()


def test_a_checkpoint_of_a_step_with_a_non_finite_loss_is_not_written(
    tmp_path: Path, tiny_model_dir: Path, pairs: list, runs: list
) -> None:
    """A deferred checkpoint falls on a step that is not logged: its loss is read before the
    checkpoint, and a broken one stops the run with the previous checkpoint still ``latest``."""
    from tango_fairscale.train.guards import NonFiniteLossError

    run = start(make_plan(tmp_path, tiny_model_dir, pairs, defer_checkpoints=True), runs)
    run.stepped(0, torch.tensor(2.0), run.batches(0), [])
    run.log_step(1, torch.tensor(2.0), 1e-3, [])
    run.checkpoint(1, wait=True)
    run.stepped(1, torch.tensor(float("nan")), run.batches(1), [])
    with pytest.raises(NonFiniteLossError, match="non-finite loss at step 2"):
        run.checkpoint(2)
    run.writer.close()
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step0000001"
    assert not list((tmp_path / "checkpoints").glob("*step0000002"))


def test_a_run_resumes_from_its_checkpoint_with_its_best_metric(
    tmp_path: Path, tiny_model_dir: Path, pairs: list, runs: list
) -> None:
    plan = make_plan(tmp_path, tiny_model_dir, pairs)
    run = start(plan, runs)
    assert run.start == 0 and run.best is None
    run.best = 0.75
    run.checkpoint(3, wait=True)
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step0000003"
    resumed = start(plan, runs, run.engine)
    assert resumed.start == 3 and resumed.best == 0.75


@pytest.mark.parametrize(
    "received, said",
    [(signal.SIGTERM, "preempted by SIGTERM"), (signal.SIGINT, "interrupted by SIGINT")],
)
def test_a_stop_signal_checkpoints_and_stops_at_the_next_log_step(
    received: signal.Signals,
    said: str,
    tmp_path: Path,
    tiny_model_dir: Path,
    pairs: list,
    runs: list,
) -> None:
    run = start(make_plan(tmp_path, tiny_model_dir, pairs), runs)
    run.stepped(0, torch.tensor(2.0), run.batches(0), [])
    signal.raise_signal(received)  # recorded, not fatal
    run.stepped(1, torch.tensor(2.0), run.batches(1), [])  # the step goes on
    with pytest.raises(TrainingStopped) as error:
        run.log_step(2, torch.tensor(2.0), 1e-3, [])
    assert str(error.value) == (
        f"{said} after step 2; rerun the same command to resume from checkpoint step0000002"
    )
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step0000002"
    assert [r["step"] for r in read_training_log(tmp_path / "training_log.jsonl")] == [2]


@pytest.mark.parametrize("to_file", [True, False])
def test_finish_hands_back_the_model_or_writes_it(
    to_file: bool, tmp_path: Path, tiny_model_dir: Path, pairs: list, runs: list
) -> None:
    plan = make_plan(tmp_path, tiny_model_dir, pairs, final_weights_to_file=to_file)
    run = start(plan, runs)
    run.stepped(0, torch.tensor(2.0), run.batches(0), [])
    run.log_step(1, torch.tensor(2.0), 1e-3, [])
    state = run.finish(0)
    expected = run.engine.wrapped_model.state_dict()
    final = tmp_path / "final_weights.pt"
    if to_file:
        assert state is None and final.is_file() and not final.with_suffix(".tmp").exists()
        state = torch.load(final, weights_only=True)
    else:
        assert state is not None and not final.exists()
    assert state.keys() == expected.keys()
    assert all(torch.equal(state[key], expected[key]) for key in expected)
    # The time split is logged once the first step's loss was.
    (split,) = [r for r in read_training_log(tmp_path / "training_log.jsonl") if "phases_s" in r]
    assert split["step"] == 1 and {"setup", "first_step", "final"} <= split["phases_s"].keys()
    assert signal.getsignal(signal.SIGTERM) != run.preemption._record  # restored


def test_finish_hands_back_the_final_checkpoints_copy_where_it_holds_the_whole_model(
    tmp_path: Path, tiny_model_dir: Path, pairs: list, runs: list, monkeypatch
) -> None:
    """DDP's rank file holds the whole model: the host copy its final checkpoint was written
    from is the model ``finish`` hands back (the engine is not asked for it again), equal to
    the committed checkpoint's and the engine's; handed over once."""
    from tango_fairscale.parallel.consolidate import full_state_dict

    run = one_step_run(tmp_path, tiny_model_dir, pairs, runs)
    run.checkpoint(1)  # the last step's: model-only, written in the background
    expected = {key: value.clone() for key, value in run.engine.full_model_state().items()}
    monkeypatch.setattr(run.engine, "full_model_state", lambda: pytest.fail("gathered again"))
    state = run.finish(0)
    assert state is not None and state.keys() == expected.keys()
    committed = full_state_dict(tmp_path / "checkpoints" / "step0000001")
    for key, value in expected.items():
        assert torch.equal(state[key], value) and torch.equal(committed[key], value)
    assert run.writer.final_model_state() is None


def test_finish_gathers_the_model_while_the_final_checkpoint_is_written(
    tmp_path: Path, tiny_model_dir: Path, pairs: list, runs: list, monkeypatch
) -> None:
    """Where the final checkpoint's copy does not hold the whole model (a sharded format), the
    model is gathered from the engine while that checkpoint is being written, not after it."""
    import threading

    run = one_step_run(tmp_path, tiny_model_dir, pairs, runs)
    fmt, engine, gathered = run.engine.checkpoint_format, run.engine, threading.Event()
    write, gather = fmt.write, engine.full_model_state

    def write_once_gathered(*args):
        if not gathered.wait(10):
            raise OSError("the model was not gathered while the checkpoint was written")
        return write(*args)

    def gather_and_tell():
        state = gather()
        gathered.set()
        return state

    monkeypatch.setattr(fmt, "full_model_state", lambda snapshot: None)  # as a sharded format
    monkeypatch.setattr(fmt, "write", write_once_gathered)
    monkeypatch.setattr(engine, "full_model_state", gather_and_tell)
    run.checkpoint(1)  # the last step's, written in the background
    state = run.finish(0)
    assert state is not None and gathered.is_set()
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step0000001"


def test_a_failed_gather_still_lets_the_final_checkpoint_commit(
    tmp_path: Path, tiny_model_dir: Path, pairs: list, runs: list, monkeypatch
) -> None:
    """A gather that fails leaves the final checkpoint's write to commit before its error goes
    on up (as a failed step does)."""
    import time

    run = one_step_run(tmp_path, tiny_model_dir, pairs, runs)
    fmt, write = run.engine.checkpoint_format, run.engine.checkpoint_format.write

    def slow_write(*args):
        time.sleep(0.5)
        return write(*args)

    def failing_gather():
        raise RuntimeError("gather failed")

    monkeypatch.setattr(fmt, "full_model_state", lambda snapshot: None)  # as a sharded format
    monkeypatch.setattr(fmt, "write", slow_write)
    monkeypatch.setattr(run.engine, "full_model_state", failing_gather)
    run.checkpoint(1)
    with pytest.raises(RuntimeError, match="gather failed"):
        run.finish(0)
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step0000001"


def test_the_model_is_handed_over_or_written_atomically_on_rank_0_only(
    tmp_path: Path, tiny_model_dir: Path, pairs: list
) -> None:
    engine = build_engine(make_plan(tmp_path, tiny_model_dir, pairs))
    path = tmp_path / "final_weights.pt"
    assert hand_over(engine.full_model_state(), path, is_main=True) is None
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["final_weights.pt"]
    written = torch.load(path, weights_only=True)
    returned = hand_over(engine.full_model_state(), None, is_main=True)
    assert returned is not None and written.keys() == returned.keys()
    path.unlink()
    hand_over(engine.full_model_state(), path, is_main=False)  # another rank writes nothing
    assert not path.exists()


def test_run_info_records_what_the_run_resolved(
    tmp_path: Path, tiny_model_dir: Path, pairs: list
) -> None:
    plan = make_plan(tmp_path, tiny_model_dir, pairs, grad_accum=2)
    engine = build_engine(plan)
    write_run_info(tmp_path / "info.json", engine, plan)
    assert json.loads((tmp_path / "info.json").read_text()) == {
        "precision": "32-true",
        "world_size": 1,
        "device": "cpu",
        "global_batch": BATCH_SIZE,
        "grad_accum": 2,
        "engine": "DDPEngine",
    }


def test_a_step_loss_reads_the_value_it_was_given() -> None:
    loss = StepLoss(3, torch.tensor(1.25, requires_grad=True) * 2)
    assert loss.step == 3 and loss.value() == 2.5


def test_the_default_validation_metric_is_the_first_tasksfirst_metric() -> None:
    metrics = {
        "piqa/acc_stderr": 0.1,
        "piqa/acc": 0.5,
        "piqa/acc_norm": 0.6,
        "boolq/acc": 0.7,
        "acc": 0.5,
    }
    assert first_metric(metrics) == "piqa/acc"
    assert first_metric({"acc": 0.5}) == ""
