"""The training loop, one process's part of a run: build the engine, resume, step, validate,
checkpoint, and hand the final weights to the launching process."""

from __future__ import annotations

import importlib
import logging
import signal
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tango.common import Lazy
from tango.common.exceptions import ConfigurationError
from tango.integrations.torch import Model, TrainCallback, TrainConfig, TrainingEngine

from ..evaluation.call import GenerationSettings
from ..model.causal_lm import packing_refusal
from ..parallel.engine import Engine
from ..runtime.process_group import join_process_group, leave_process_group, spawned_store
from ..tasks.lm_eval import TaskSpec
from .run import FINAL_WEIGHTS, TrainingRun

__all__ = ["FINAL_WEIGHTS", "TrainPlan", "build_engine", "train", "train_worker"]

logger = logging.getLogger(__name__)


@dataclass
class TrainPlan:
    """Everything a training process needs, validated by the launching process."""

    config: TrainConfig
    model: Lazy[Model]
    engine: Lazy[TrainingEngine]
    #: (context, continuation) of each training example's correct choice.
    training_pairs: list[tuple[str, str]]
    validate_tasks: list[TaskSpec]
    batch_size: int
    eval_batch_size: int
    preemption_signal: signal.Signals = signal.SIGTERM
    collective_timeout_s: float = 600.0
    #: ``None``: packed where the engine takes packed batches (:func:`build_engine` decides).
    pack_sequences: bool | None = False
    #: Modules that register the model's and engine's types: worker processes import them.
    component_modules: tuple[str, ...] = ()
    callbacks: list[Lazy[TrainCallback]] = field(default_factory=list)
    #: The Tango workspace the step runs in (for callbacks).
    workspace: Any = None
    #: The summary key handed to callbacks as ``val_metric`` (higher is better).
    val_metric: str | None = None
    #: Complete checkpoints kept (the newest); older ones are deleted.
    keep_checkpoints: int = 2
    #: The run's id, which every file of its checkpoints carries (made by the launching process,
    #: kept beside the checkpoints; ``None``: each process reads or makes it there).
    run_id: str | None = None
    #: How validation tasks that generate text decode (part of the step's cache key).
    generation: GenerationSettings = field(default_factory=GenerationSettings)
    #: Rank 0 writes the trained model to ``final_weights.pt`` (always when it is a spawned
    #: process); ``False``: it returns it to the launching process it runs in, which saves a
    #: write and a read of the whole model (the training step's plans).
    final_weights_to_file: bool = True

    @property
    def checkpoints(self) -> Path:
        return self.config.work_dir / "checkpoints"


def train_worker(
    rank: int, plan: TrainPlan, store: dist.Store | None = None
) -> dict[str, torch.Tensor] | None:
    """Rank ``rank``'s part of ``plan``: join the process group (in ``store``, a launcher's, or
    at the config's address), train, leave; the trained model where rank 0 returns it."""
    config = plan.config
    config.worker_id = rank
    torch.manual_seed(config.seed)
    join_process_group(config, timedelta(seconds=plan.collective_timeout_s), store)
    try:
        return train(build_engine(plan), plan)
    finally:
        leave_process_group()


def spawned_worker(rank: int, plan: TrainPlan) -> None:
    """:func:`train_worker` in a process spawned by ``run_training``, which holds the store the
    processes meet in (:func:`~tango_fairscale.runtime.process_group.hosted_store`)."""
    timeout = timedelta(seconds=plan.collective_timeout_s)
    plan.final_weights_to_file = True
    train_worker(rank, plan, spawned_store(plan.config, timeout))


def build_engine(plan: TrainPlan) -> Engine:
    """The plan's engine, its model built and wrapped; ``plan.pack_sequences`` ``None`` becomes
    whether the engine takes packed batches, ``True`` is refused (one line) where it does not."""
    for module in plan.component_modules:
        importlib.import_module(module)
    engine = plan.engine.construct(train_config=plan.config, model=plan.model)
    if not isinstance(engine, Engine):
        raise ConfigurationError(
            f"'engine' must be a tango_fairscale engine, got {type(engine).__name__}"
        )
    if plan.pack_sequences is None:
        plan.pack_sequences = engine.accepts_packed_batches
    elif plan.pack_sequences and not engine.accepts_packed_batches:
        model = engine.wrapped_model
        if not model.supports_packing:
            raise ConfigurationError(packing_refusal(model))
        raise ConfigurationError(
            f"pack_sequences needs an engine that takes packed batches; "
            f"{type(engine).__name__} does not (the pipe engine never does): set "
            "pack_sequences to null (packed where possible) or false"
        )
    return engine


def train(engine: Engine, plan: TrainPlan) -> dict[str, torch.Tensor] | None:
    """The loop. Every rank runs it (the data of a step is a pure function of the seed and the
    step, so a resumed run continues where it stopped); rank 0 logs and writes, and returns the
    trained model unless it writes it for its launching process (:meth:`TrainingRun.finish`)."""
    run = TrainingRun(engine, plan)
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
            if stop or run.is_checkpoint_step(done):
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
    ``keep_outputs``, each micro-batch's outputs."""
    step_loss = torch.zeros((), device=engine.device)
    outputs = []
    for index, batch in enumerate(batches):
        loss, batch_outputs = engine.forward_train(batch, index, len(batches))
        engine.backward(loss)
        step_loss += loss.detach()
        if keep_outputs:
            outputs.append(batch_outputs)
    return step_loss, outputs
