"""The training loop, one process's part of a run: build the engine, resume, step, validate,
checkpoint, and hand the final weights to the launching process."""

from __future__ import annotations

import importlib
import logging
import os
import signal
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tango.common import Lazy, Tqdm
from tango.common.exceptions import ConfigurationError
from tango.integrations.torch import Model, TrainConfig, TrainingEngine

from ..data.batches import training_batch
from ..data.queries import Query, encode_pairs
from ..data.schedules import BatchSchedule
from ..evaluation.harness import evaluate_task, merge, summary
from ..evaluation.lm import ScorerLM
from ..parallel.engine import Engine
from ..runtime.process_group import barrier, join_process_group, leave_process_group
from ..runtime.signals import Preemption
from ..tasks.lm_eval import TaskDict, TaskSpec, load_tasks
from .checkpoints import TrainingStopped, resume, resume_hint, save_checkpoint
from .guards import NonFiniteGuard, any_rank
from .log import TRAINING_LOG, TrainingLog

logger = logging.getLogger(__name__)

#: Where rank 0 leaves the consolidated model for the launching process.
FINAL_WEIGHTS = "final_weights.pt"


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
    pack_sequences: bool = False
    #: Modules that register the model's and engine's types: spawned processes import them.
    component_modules: tuple[str, ...] = ()

    @property
    def checkpoints(self) -> Path:
        return self.config.work_dir / "checkpoints"


def train_worker(rank: int, plan: TrainPlan, store: dist.Store | None = None) -> None:
    """Rank ``rank``'s part of ``plan``: join the process group (in ``store``, a launcher's, or
    at the config's address), train, leave."""
    config = plan.config
    config.worker_id = rank
    torch.manual_seed(config.seed)
    join_process_group(config, timedelta(seconds=plan.collective_timeout_s), store)
    try:
        train(build_engine(plan), plan)
    finally:
        leave_process_group()


def build_engine(plan: TrainPlan) -> Engine:
    for module in plan.component_modules:
        importlib.import_module(module)
    engine = plan.engine.construct(train_config=plan.config, model=plan.model)
    if not isinstance(engine, Engine):
        raise ConfigurationError(
            f"'engine' must be a tango_fairscale engine, got {type(engine).__name__}"
        )
    if plan.pack_sequences and not engine.accepts_packed_batches:
        attention = engine.wrapped_model.model.config._attn_implementation
        raise ConfigurationError(
            f"pack_sequences needs an engine whose model takes packed batches; "
            f"{type(engine).__name__} with attention {attention!r} does not (the pipe engine "
            "never does): set pack_sequences to false"
        )
    return engine


def train(engine: Engine, plan: TrainPlan) -> None:
    """The loop. Every rank runs it; rank 0 logs and writes the final weights."""
    config = plan.config
    assert config.train_steps is not None
    is_main = config.is_local_main_process
    model = engine.wrapped_model
    queries = encode_pairs(model.tokenizer, plan.training_pairs, model.max_length)
    schedule = BatchSchedule(
        len(queries),
        plan.batch_size,
        config.seed,
        config.world_size,
        config.worker_id,
        config.grad_accum,
    )
    validation = [(spec, load_tasks(spec)) for spec in plan.validate_tasks]
    start = resume(engine, plan.checkpoints, is_main)
    if start:
        logger.info("resumed from the checkpoint at step %d", start)
    log = TrainingLog(config.work_dir / TRAINING_LOG, enabled=is_main)
    guard = NonFiniteGuard(engine.grad_scaler is not None, schedule.global_batch)
    preemption = Preemption(plan.preemption_signal)
    steps = Tqdm.tqdm(
        range(start, config.train_steps),
        desc="Training",
        initial=start,
        total=config.train_steps,
        disable=not is_main,
    )
    unread: StepLoss | None = None  # the previous step's loss, on its way to the host
    engine.model.train()
    try:
        for step in steps:
            done = step + 1
            loss = forward_backward(engine, queries, schedule.micro_batches(step), plan)
            if unread is not None:  # read while this step's work runs: no wait in the loop
                guard.observe(unread.step, unread.value())
            lr = engine.optimizer.param_groups[0]["lr"]  # this step's (the scheduler moves on)
            engine.step()
            unread = StepLoss(done, loss)
            checkpoint_now = _every(done, config.checkpoint_every) or done == config.train_steps
            if done == 1 or _every(done, config.log_every) or checkpoint_now:
                guard.observe(done, unread.value())
                unread = None
                # Agreed by all ranks before logging, validating or checkpointing.
                preempted = any_rank(preemption.received, engine.device)
                mean_loss = _mean_over_ranks(loss)
                log.write({"step": done, "train_loss": mean_loss, "lr": lr})
                steps.set_postfix(loss=f"{mean_loss:.4f}")
                if preempted:
                    save_checkpoint(engine, plan.checkpoints, done, is_main)
                    raise TrainingStopped(
                        f"preempted by {preemption.signal.name} after step {done}; "
                        f"{resume_hint(plan.checkpoints)}"
                    )
            if validation and (done == config.train_steps or _every(done, config.validate_every)):
                metrics = validate(engine, plan, validation)
                log.write({"step": done, **{f"val_{k}": v for k, v in metrics.items()}})
                if is_main:
                    logger.info("step %d: validation %s", done, _brief(metrics))
            if checkpoint_now:
                save_checkpoint(engine, plan.checkpoints, done, is_main)
    finally:
        preemption.restore()
    export_final_weights(engine, config.work_dir / FINAL_WEIGHTS, is_main)


def forward_backward(
    engine: Engine, queries: list[Query], micro_batches: list[list[int]], plan: TrainPlan
) -> torch.Tensor:
    """One step's forward and backward passes over its micro-batches; returns the step's loss."""
    model = engine.wrapped_model
    step_loss = torch.zeros((), device=engine.device)
    for index, micro_batch in enumerate(micro_batches):
        batch = training_batch(
            [queries[i] for i in micro_batch],
            model.pad_token_id,
            model.max_length,
            packed=plan.pack_sequences,
        )
        loss, _ = engine.forward_train(batch, index, len(micro_batches))
        engine.backward(loss)
        step_loss += loss.detach()
    return step_loss


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


def validate(
    engine: Engine, plan: TrainPlan, tasks: list[tuple[TaskSpec, TaskDict]]
) -> dict[str, Any]:
    """lm-eval's metrics of the validation tasks (the flat summary of
    :func:`~tango_fairscale.evaluation.harness.summary`), every rank scoring its share through
    the engine."""
    model = engine.wrapped_model
    lm = ScorerLM(
        engine.forward_eval,
        model.tokenizer,
        max_length=model.max_length,
        device=engine.device,
        batch_size=plan.eval_batch_size,
        packed=plan.pack_sequences,
        progress=plan.config.is_local_main_process,
    )
    engine.model.eval()
    try:
        return summary(merge([evaluate_task(lm, spec, loaded) for spec, loaded in tasks]))
    finally:
        engine.model.train()


def _brief(metrics: dict[str, Any]) -> str:
    shown = [f"{key} {value:.4f}" for key, value in metrics.items() if "/" in key and
             isinstance(value, float) and "stderr" not in key]  # fmt: skip
    return ", ".join(shown)


def export_final_weights(engine: Engine, path: Path, is_main: bool) -> None:
    """Gather the full model (every rank takes part); rank 0 writes it to ``path`` atomically."""
    state = engine.full_model_state()
    if is_main:
        assert state is not None
        torch.save(state, path.with_suffix(".tmp"))
        os.replace(path.with_suffix(".tmp"), path)
    barrier()


def _every(step: int, interval: int | None) -> bool:
    return interval is not None and step % interval == 0


def _mean_over_ranks(value: torch.Tensor) -> float:
    if dist.is_initialized():
        value = value.clone()
        dist.all_reduce(value)
        value /= dist.get_world_size()
    return float(value.item())
