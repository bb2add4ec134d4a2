"""The training loop, one process's part of a run: build the engine, resume, step, validate,
checkpoint, and hand the final weights to the launching process."""

from __future__ import annotations

import importlib
import logging
from dataclasses import replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from tango.common.exceptions import ConfigurationError

from ..model.causal_lm import packing_refusal
from ..parallel.engine import Engine
from ..parallel.graphs import CaptureFailed
from ..runtime.process_group import join_process_group, leave_process_group, spawned_store
from .meter import PhaseClock
from .plan import TrainPlan, TrainRuntime
from .run import FINAL_WEIGHTS, TrainingRun

__all__ = ["FINAL_WEIGHTS", "TrainPlan", "TrainRuntime", "build_engine", "train", "train_worker"]

logger = logging.getLogger(__name__)


def train_worker(
    rank: int, plan: TrainPlan, store: dist.Store | None = None
) -> dict[str, torch.Tensor] | None:
    """Rank ``rank``'s part of ``plan``: join the process group (in ``store``, a launcher's, or
    at the config's address), train, leave; the trained model where rank 0 returns it."""
    config = plan.config
    config.worker_id = rank
    torch.manual_seed(config.seed)
    clock = PhaseClock(data=plan.data_seconds)
    join_process_group(config, timedelta(seconds=plan.runtime.collective_timeout_s), store)
    try:
        engine = build_engine(plan)
        clock.lap("engine")
        return train(engine, plan, clock)
    finally:
        leave_process_group()


def spawned_worker(rank: int, plan: TrainPlan) -> None:
    """:func:`train_worker` in a process spawned by ``run_training``, which holds the store the
    processes meet in (:func:`~tango_fairscale.runtime.process_group.hosted_store`)."""
    timeout = timedelta(seconds=plan.runtime.collective_timeout_s)
    plan.final_weights_to_file = True
    train_worker(rank, plan, spawned_store(plan.config, timeout))


def build_engine(plan: TrainPlan) -> Engine:
    """The plan's engine, its model built and wrapped; ``plan.runtime.pack_sequences`` ``None``
    becomes whether the engine takes packed batches, ``True`` is refused (one line) where it does
    not."""
    for module in plan.component_modules:
        importlib.import_module(module)
    engine = plan.engine.construct(train_config=plan.config, model=plan.model)
    if not isinstance(engine, Engine):
        raise ConfigurationError(
            f"'engine' must be a tango_fairscale engine, got {type(engine).__name__}"
        )
    packing = plan.runtime.pack_sequences
    if packing is None:
        plan.runtime = replace(plan.runtime, pack_sequences=engine.accepts_packed_batches)
    elif packing and not engine.accepts_packed_batches:
        model = engine.wrapped_model
        if not model.supports_packing:
            raise ConfigurationError(packing_refusal(model))
        raise ConfigurationError(
            f"pack_sequences needs an engine that takes packed batches; "
            f"{type(engine).__name__} does not (the pipe engine never does): set "
            "pack_sequences to null (packed where possible) or false"
        )
    return engine


def train(
    engine: Engine, plan: TrainPlan, clock: PhaseClock | None = None
) -> dict[str, torch.Tensor] | None:
    """The loop. Every rank runs it (the data of a step is a pure function of the seed and the
    step, so a resumed run continues where it stopped); rank 0 logs and writes, and returns the
    trained model unless it writes it for its launching process (:meth:`TrainingRun.finish`).
    ``clock`` holds the phases before it (:func:`train_worker`'s)."""
    run = TrainingRun(engine, plan, clock)
    step = run.start
    engine.model.train()
    run.callbacks.call("pre_train_loop")
    try:
        for step in run.steps():
            done, epoch = step + 1, run.epoch(step)
            if step == run.start or step % run.schedule.steps_per_epoch == 0:
                run.callbacks.call("pre_epoch", step, epoch)
            batches = run.batches(step)
            run.callbacks.call("pre_batch", step, epoch, batches)
            loss, outputs = forward_backward(engine, batches, keep_outputs=bool(run.callbacks))
            run.check_previous_loss()
            lr = engine.optimizer.param_groups[0]["lr"]  # this step's (the scheduler moves on)
            engine.step()
            run.stepped(step, loss, batches, outputs)
            if run.is_log_step(done):
                run.log_step(done, loss, lr, outputs)
            stop = run.validate(done) if run.is_validation_step(done) else False
            if run.wants_checkpoint(done, stop):
                run.checkpoint(done)
            if done % run.schedule.steps_per_epoch == 0:
                run.callbacks.call("post_epoch", step, epoch)
            if stop:
                break
    except Exception:  # a checkpoint in flight is committed if it can be (not on a 2nd Ctrl-C)
        run.writer.settle()
        raise
    finally:
        run.preemption.restore()
    return run.finish(step)


def forward_backward(
    engine: Engine, batches: list[dict[str, torch.Tensor]], keep_outputs: bool = False
) -> tuple[torch.Tensor, list[dict[str, Any]]]:
    """One step's forward and backward passes over its micro-batches: the step's loss and, with
    ``keep_outputs``, each micro-batch's outputs. Replayed from a CUDA graph where the engine
    has them (:mod:`~tango_fairscale.parallel.graphs`) and the step can be; a step that cannot be
    captured runs eagerly, and so does every later one."""
    if engine.graphs is not None and engine.graphs.takes(batches, keep_outputs):
        try:
            return engine.graphs.forward_backward(batches), []
        except CaptureFailed as failure:
            logger.warning(
                "training steps run eagerly from here: this model's step cannot be captured as "
                "a CUDA graph (%s)",
                failure,
            )
            engine.graphs = None
    step_loss = torch.zeros((), device=engine.device)
    outputs = []
    for index, batch in enumerate(batches):
        loss, batch_outputs = engine.forward_train(batch, index, len(batches))
        engine.backward(loss)
        step_loss += loss.detach()
        if keep_outputs:
            outputs.append(batch_outputs)
    return step_loss, outputs
