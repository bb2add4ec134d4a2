"""One process's training run, step by step: its data and schedule, what it observes after each
step (losses, throughput, callbacks, preemption), validation, checkpoints and the final export."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tango.common.logging import cli_logger
from tango.integrations.torch import StopEarly

from ..data.batches import training_batch
from ..data.queries import encode_pairs
from ..data.schedules import BatchSchedule
from ..evaluation.harness import requests_built_once
from ..parallel.engine import Engine
from ..records.checkpoints import run_id
from ..records.run_info import RunInfo, precision_label
from ..records.training_log import TrainingLog
from ..records.work_dir import FINAL_WEIGHTS, RUN_INFO, TRAINING_LOG
from ..runtime.process_group import alone, barrier
from ..runtime.signals import Preemption
from ..tasks.lm_eval import load_tasks
from .callbacks import Callbacks
from .checkpoints import BackgroundWriter, CheckpointPolicy, TrainingStopped, resume, resume_hint
from .guards import NonFiniteGuard, any_rank
from .meter import PhaseClock, Throughput
from .plan import TrainPlan
from .progress import TrainingBar
from .validation import describe_validation, evaluator, first_metric, validate

logger = logging.getLogger(__name__)


class TrainingRun:
    """The state of one process's run of a plan (:class:`~tango_fairscale.train.loop.TrainPlan`),
    resumed from its newest checkpoint; rank 0 logs and writes."""

    def __init__(self, engine: Engine, plan: TrainPlan, clock: PhaseClock | None = None) -> None:
        self.clock = clock or PhaseClock()  # its next lap, setup, starts here
        self.engine, self.plan, config = engine, plan, plan.config
        self.config = config
        self.is_main = config.is_local_main_process
        model = engine.wrapped_model
        self.model = model
        self.queries = encode_pairs(model.tokenizer, plan.training_pairs, model.max_length)
        self.schedule = BatchSchedule(
            len(self.queries),
            plan.batch_size,
            config.seed,
            config.world_size,
            config.worker_id,
            config.grad_accum,
        )
        # Each validation takes the requests (and their encodings) the first one built.
        self.validation = [
            (spec, requests_built_once(load_tasks(spec))) for spec in plan.validate_tasks
        ]
        self.evaluator = evaluator(engine, plan)
        for spec, loaded in self.validation:  # what this engine or model cannot do: now
            self.evaluator.check(spec, loaded)
        self.callbacks = Callbacks(
            plan.callbacks,
            workspace=plan.workspace,
            train_config=config,
            engine=engine,
            training_pairs=plan.training_pairs,
        )
        self.checkpoints = CheckpointPolicy(
            plan.checkpoints,
            plan.run_id or run_id(plan.checkpoints),
            plan.runtime.keep_checkpoints,
        )
        self.writer = BackgroundWriter(engine, self.checkpoints, plan.runtime.collective_timeout_s)
        self.checkpoint_due = False  # a cadence checkpoint not taken yet (its write deferred)
        resumed = resume(engine, plan.checkpoints, self.is_main)
        self.start = int(resumed.get("step", 0))
        if self.start:
            logger.info("resumed from the checkpoint at step %d", self.start)
            self.callbacks.load_state_dict(resumed.get("callbacks", []))
        self.best: float | None = resumed.get("best_val_metric")
        self.log = TrainingLog(config.work_dir / TRAINING_LOG, enabled=self.is_main)
        if self.is_main:
            write_run_info(config.work_dir / RUN_INFO, engine, plan)
        self.throughput = Throughput(model.num_parameters, engine.device, config.world_size)
        self.guard = NonFiniteGuard(
            engine.grad_scaler is not None,
            self.schedule.global_batch,
            model.model.config.get_text_config().vocab_size,
        )
        self.preemption = Preemption(plan.runtime.preemption)
        self.bar = TrainingBar(self.start, plan.train_steps, self.is_main)
        self.unread: StepLoss | None = None  # the previous step's loss, on its way to the host
        self.first_logged = self.start  # the step whose log ended the first_step phase
        self.clock.lap("setup")

    def steps(self) -> Any:
        """The steps left, under the progress bar on rank 0 (:class:`.progress.TrainingBar`)."""
        return self.bar

    def epoch(self, step: int) -> int:
        return step // self.schedule.steps_per_epoch

    def batches(self, step: int) -> list[dict[str, torch.Tensor]]:
        """Step ``step``'s micro-batches for this rank (a pure function of the seed and step)."""
        return [
            training_batch(
                [self.queries[i] for i in micro_batch],
                self.model.pad_token_id,
                self.model.max_length,
                packed=self.plan.packed,
            )
            for micro_batch in self.schedule.micro_batches(step)
        ]

    def check_previous_loss(self) -> None:
        """Raise if the previous step's loss broke the run: read while this step's work runs,
        so the loop never waits for the device just to look."""
        if self.unread is not None:
            self.guard.observe(self.unread.step, self.unread.value())

    def read_loss(self, done: int) -> None:
        """Read step ``done``'s loss where it is not read yet: the guard raises on a broken one
        (not finite, diverged)."""
        if self.unread is not None and self.unread.step == done:
            self.guard.observe(done, self.unread.value())
            self.unread = None

    def stepped(self, step: int, loss: torch.Tensor, batches: list, outputs: list) -> None:
        """After step ``step``'s optimizer step: count its tokens, call ``post_batch``."""
        self.unread = StepLoss(step + 1, loss)
        for batch in batches:
            self.throughput.count(batch)
        self.bar.stepped(step + 1)
        if self.callbacks:
            self.callbacks.call("post_batch", step, self.epoch(step), self.unread.value(), outputs)

    def is_log_step(self, done: int) -> bool:
        return done == 1 or _every(done, self.config.log_every) or self.is_checkpoint_step(done)

    def is_checkpoint_step(self, done: int) -> bool:
        return _every(done, self.config.checkpoint_every) or done == self.config.train_steps

    def wants_checkpoint(self, done: int, stop: bool) -> bool:
        """Whether to checkpoint after ``done`` steps: at the cadence, after the last step, on a
        stop; one due while the previous write is in flight on any rank waits for the first step
        after it (``runtime.defer_checkpoints``): the loop does not wait for the disk."""
        if stop or done == self.config.train_steps:
            return True
        due = _every(done, self.config.checkpoint_every)
        if not self.plan.runtime.defer_checkpoints:
            return due
        self.checkpoint_due = self.checkpoint_due or due
        return self.checkpoint_due and not any_rank(self.writer.busy, self.engine.device)

    def is_validation_step(self, done: int) -> bool:
        last = done == self.config.train_steps
        return bool(self.validation) and (last or _every(done, self.config.validate_every))

    def log_step(self, done: int, loss: torch.Tensor, lr: float, outputs: list) -> None:
        """Log the loss, learning rate and throughput after ``done`` steps (rank 0), once every
        rank agrees that the run is sound and not preempted (preempted: checkpoint and stop)."""
        assert self.unread is not None
        self.read_loss(done)
        if "first_step" in self.clock.seconds:
            self.clock.lap("steps")
        else:  # the first step's loss (the first log step's, after a resume) reached the host
            self.clock.lap("first_step")
            self.first_logged = done
            self.writer.prepare(self.checkpoint_extra())  # the optimizer's state exists now
        self.writer.check()
        preempted = any_rank(self.preemption.received, self.engine.device)
        mean_loss, tokens = _reduce_over_ranks(loss, self.throughput.tokens)
        figures = self.throughput.report(tokens)
        self.log.write({"step": done, "train_loss": mean_loss, "lr": lr, **figures})
        self.bar.show(mean_loss, lr, figures)
        self.callbacks.call("log_batch", done - 1, self.epoch(done - 1), mean_loss, outputs)
        if preempted:
            self.checkpoint(done, wait=True)
            received = self.preemption.signal
            how = "interrupted" if received == signal.SIGINT else "preempted"
            raise TrainingStopped(
                f"{how} by {received.name} after step {done}; {resume_hint(self.plan.checkpoints)}"
            )

    def validate(self, done: int) -> bool:
        """Score the validation tasks with every rank through the engine, log lm-eval's metrics
        (``val_<task>/<metric>``) and call ``post_val_loop``; whether a callback stops the run."""
        self.clock.lap("steps")
        metrics = validate(self.engine, self.evaluator, self.validation)
        self.clock.lap("validation")
        self.log.write({"step": done, **{f"val_{k}": v for k, v in metrics.items()}})
        if self.is_main:  # at Tango's default log level, as the final metrics are
            cli_logger.info(
                "step %d/%d validation: %s",
                done,
                self.config.train_steps,
                describe_validation(metrics),
            )
        self.throughput.skip()
        self.bar.skip()
        value = metrics.get(self.plan.val_metric or first_metric(metrics))
        if not isinstance(value, (int, float)):
            return False
        self.best = value if self.best is None else max(self.best, value)
        try:
            self.callbacks.call("post_val_loop", done - 1, self.epoch(done - 1), value, self.best)
        except StopEarly:
            logger.info("a callback stopped training early after step %d", done)
            return True
        finally:
            self.engine.model.train()
        return False

    def checkpoint(self, done: int, wait: bool = False) -> None:
        """Start writing the checkpoint after ``done`` steps (:class:`.checkpoints.
        BackgroundWriter`); ``wait``: until it is committed. The last step's is what a finished
        run keeps: without the optimizer state unless ``runtime.keep_optimizer_state``, and it
        supersedes a write still in flight (abandoned, not waited for). A step whose loss was not
        read yet (a deferred checkpoint's, a stop's) has it read first: a broken step's weights
        never become a checkpoint."""
        self.read_loss(done)
        extra = self.checkpoint_extra()
        final = done == self.plan.train_steps
        model_only = final and not self.plan.runtime.keep_optimizer_state
        self.clock.lap("steps")
        self.writer.save(done, extra, wait=wait, model_only=model_only, supersede=final)
        self.checkpoint_due = False
        self.clock.lap("checkpoints")
        self.throughput.skip()
        self.bar.skip()

    def checkpoint_extra(self) -> dict[str, Any]:
        """What a checkpoint keeps besides the engine's state: the best validation metric and
        the callbacks' state."""
        extra: dict[str, Any] = {"best_val_metric": self.best}
        if self.callbacks:
            extra["callbacks"] = self.callbacks.state_dict()
        return extra

    def finish(self, step: int) -> dict[str, torch.Tensor] | None:
        """The run's model, the last checkpoint committed, ``post_train_loop``, then the model
        handed to the launching process: returned by rank 0 where it is that process, else
        written to ``final_weights.pt`` (``plan.final_weights_to_file``). The model is the final
        checkpoint's (as Tango's ``torch::train`` takes its final weights from its checkpoint):
        its host copy where that holds the whole model (one process's bare model, DDP), else
        gathered from the engine while that checkpoint is being written."""
        self.clock.lap("steps")
        try:
            # Rank 0's (None on the others). Only rank 0 holds a whole copy where the others'
            # gather runs no collective (replicas); shards are gathered on every rank.
            state = self.writer.final_model_state()
            if state is None:
                state = self.engine.full_model_state()
        except BaseException:  # the final checkpoint still committed if it can be
            self.writer.settle()
            raise
        self.writer.close()
        barrier()
        self.preemption.restore()
        self.callbacks.call("post_train_loop", step, self.epoch(step))
        path = self.config.work_dir / FINAL_WEIGHTS if self.plan.final_weights_to_file else None
        state = hand_over(state, path, self.is_main)
        self.clock.lap("final")
        if "first_step" in self.clock.seconds:  # not when resumed with no step left
            self.log_time_split(step)
        return state

    def log_time_split(self, step: int) -> None:
        """Where the run's time went (and its background checkpoint writes): logged, shown."""
        writes = [round(seconds, 2) for seconds in self.writer.write_seconds]
        self.log.write(
            {"step": step + 1, "phases_s": self.clock.summary(), "checkpoint_writes_s": writes}
        )
        if self.is_main:
            ran = step + 1 - self.start
            split = self.clock.describe(self.first_logged - self.start, ran)
            if writes:
                split += f" ({len(writes)} written in the background in {sum(writes):.1f} s)"
            cli_logger.info("%s", split)


class StepLoss:
    """A step's loss copied to the host without waiting; :meth:`value` waits for it."""

    def __init__(self, step: int, loss: torch.Tensor) -> None:
        self.step = step
        self._host = loss.detach().to("cpu", non_blocking=True)
        self._done = torch.cuda.Event() if loss.is_cuda else None
        if self._done is not None:
            self._done.record()

    def value(self) -> float:
        if self._done is not None:
            self._done.synchronize()
        return float(self._host)


def write_run_info(path: Path, engine: Engine, plan: TrainPlan) -> None:
    """What this run resolved (:class:`~tango_fairscale.records.run_info.RunInfo`) into ``path``."""
    RunInfo(
        precision=precision_label(engine.precision.name, engine.float8),
        world_size=plan.config.world_size,
        device=engine.device.type,
        global_batch=plan.batch_size,
        grad_accum=plan.config.grad_accum,
        engine=type(engine).__name__,
    ).write(path)


def hand_over(
    state: dict[str, torch.Tensor] | None, path: Path | None, is_main: bool
) -> dict[str, torch.Tensor] | None:
    """Rank 0's ``state``: returned, or written to ``path`` atomically (and ``None`` returned);
    every rank meets in a barrier."""
    if is_main and path is not None:
        assert state is not None
        torch.save(state, path.with_suffix(".tmp"))
        os.replace(path.with_suffix(".tmp"), path)
        state = None
    barrier()
    return state


def _every(step: int, interval: int | None) -> bool:
    return interval is not None and step % interval == 0


def _reduce_over_ranks(loss: torch.Tensor, tokens: int) -> tuple[float, int]:
    """The loss averaged and the token count summed over the ranks (one all-reduce)."""
    values = torch.stack([loss.detach().double(), loss.new_tensor(tokens, dtype=torch.float64)])
    if not alone():
        dist.all_reduce(values)
        values[0] /= dist.get_world_size()
    mean_loss, total = values.tolist()
    return mean_loss, int(total)
