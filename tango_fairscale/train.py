"""The training step: one controller loop over any engine, checkpointed and resumable.

The loop follows Tango's ``torch::train`` contract (a ``TrainingEngine`` does forward / backward /
step and writes checkpoints; ``TrainConfig`` describes the run) and adds what sharded training
needs: every rank validates through the engine, checkpoints are written to a temporary directory
and renamed into place only when every rank has finished (a crash never leaves a half checkpoint
that looks complete), the data position is a pure function of the step (resuming needs no
replay), and the final model is consolidated from the engine and loaded strictly.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tango import Format, Step
from tango.common import Lazy, Tqdm
from tango.common.aliases import EnvVarNames
from tango.common.dataset_dict import DatasetDictBase
from tango.common.exceptions import ConfigurationError
from tango.common.logging import initialize_worker_logging
from tango.integrations.torch import Model, TrainConfig, TrainingEngine
from tango.step import StepResources

from . import launcher
from .batching import BatchSchedule, training_batch, training_queries
from .engines.base import Engine, free_port, init_process_group
from .evaluation import validate_all_ranks
from .format import TRAINING_LOG, ModelFormat
from .model import ModelWrapper

logger = logging.getLogger(__name__)

FINAL_WEIGHTS = "final_weights.pt"
PREEMPTION_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGINT")


@dataclass
class TrainPlan:
    """Everything a worker process needs, validated in the launching process."""

    config: TrainConfig
    model: Lazy[Model]
    engine: Lazy[TrainingEngine]
    dataset_dict: DatasetDictBase
    batch_size: int
    eval_batch_size: int
    preemption_signal: signal.Signals = signal.SIGTERM
    collective_timeout_s: float = 600.0
    pack_sequences: bool = False

    @property
    def checkpoints(self) -> Path:
        return self.config.work_dir / "checkpoints"


@Step.register("tango_fairscale::train")
class TrainStep(Step[ModelWrapper]):
    """Fine-tune a :class:`~tango_fairscale.model.ModelWrapper` on PIQA with any package engine.

    Registered as a Tango ``Step`` under the name ``"tango_fairscale::train"``.

    :param model: the model to train (constructed inside each worker).
    :param engine: a ``TrainingEngine`` (``tango_fairscale::ddp``, ...) with its optimizer.
    :param dataset_dict: PIQA splits from ``tango_fairscale::piqa``.
    :param train_steps: optimizer steps.
    :param batch_size: examples per optimizer step over all devices (not per device), so the run
        is the same on any number of devices; must divide by ``device_count × grad_accum``.
    :param grad_accum: micro-batches per step on each device.
    :param validate_every: PIQA validation accuracy every this many steps (and after the last),
        computed by all ranks through the engine; ``None`` validates only after the last step.
    :param checkpoint_every: steps between checkpoints; a rerun resumes from the newest one.
    :param device_count: processes, one per GPU (or CPU processes over gloo without GPUs).
    :param preemption_signal: on this signal (``SIGTERM``, ``SIGUSR1``, ...) every rank finishes
        its step, a checkpoint is written and the step fails with :class:`TrainingStopped`;
        rerunning the same command resumes.
    :param collective_timeout_s: a rank that hangs (without dying) makes the others fail after
        this many seconds in a collective, instead of waiting forever.
    :param pack_sequences: feed micro-batches (and validation batches) packed end to end instead
        of right-padded (:func:`~tango_fairscale.batching.packed_batch`): the same losses up to
        float rounding, far fewer positions on short data such as PIQA (measured on an H200,
        PIQA batch 16: GPT-2 124M fp32 1.30x the tokens/s in half the memory, bf16 1.05x per
        median step, though each new batch shape costs a one-off kernel selection and packed
        batches have more shapes; GPT-2 1.5B bf16 at batch 64: 1.92x in a third of the memory).
        Not for the ``pipe`` engine.

    Returns the trained model; its ``training_log`` holds the logged loss and accuracy by step.
    ``log_every``, ``eval_batch_size``, ``distributed_port``, ``device_count`` and
    ``pack_sequences`` are not part of the cache key: 1 or 8 devices, packed or not, train the
    same model (up to float rounding).

    Example (Jsonnet)::

        trained_model: {type: "tango_fairscale::train", model: {...}, dataset_dict: {ref: "piqa"},
                        engine: {type: "tango_fairscale::ddp", optimizer: {type: "torch::AdamW"}},
                        train_steps: 2000, batch_size: 16, device_count: 2}
    """

    VERSION = "001"
    DETERMINISTIC = True
    CACHEABLE = True
    FORMAT: Format = ModelFormat()
    # The result does not depend on the number of devices (the batch is global), so a run may be
    # resumed on another number of devices where the engine can reshard its checkpoints.
    SKIP_ID_ARGUMENTS = {
        "log_every",
        "eval_batch_size",
        "distributed_port",
        "device_count",
        "preemption_signal",
        "collective_timeout_s",
        "pack_sequences",
    }

    @property
    def resources(self) -> StepResources:
        return self.step_resources or StepResources(gpu_count=self.kwargs.get("device_count", 1))

    def run(  # type: ignore[override]
        self,
        model: Lazy[Model],
        engine: Lazy[TrainingEngine],
        dataset_dict: DatasetDictBase,
        *,
        train_steps: int,
        batch_size: int = 16,
        grad_accum: int = 1,
        seed: int = 42,
        train_split: str = "train",
        validation_split: str | None = "validation",
        validate_every: int | None = None,
        checkpoint_every: int = 100,
        device_count: int = 1,
        log_every: int = 10,
        eval_batch_size: int = 32,
        distributed_port: int | None = None,
        preemption_signal: str = "SIGTERM",
        collective_timeout_s: int = 600,
        pack_sequences: bool = False,
    ) -> ModelWrapper:
        for name, value in (
            ("train_steps", train_steps),
            ("batch_size", batch_size),
            ("grad_accum", grad_accum),
            ("checkpoint_every", checkpoint_every),
            ("device_count", device_count),
            ("log_every", log_every),
            ("eval_batch_size", eval_batch_size),
            ("validate_every", 1 if validate_every is None else validate_every),
            ("collective_timeout_s", collective_timeout_s),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"{name} must be a positive integer, got {value!r}")
        for split in (train_split, validation_split):
            if split is not None and split not in dataset_dict:
                raise ConfigurationError(
                    f"split {split!r} is not in the dataset; choose one of "
                    f"{sorted(dataset_dict.keys())}"
                )
        if validation_split is not None and len(dataset_dict[validation_split]) == 0:
            raise ConfigurationError(
                f"validation split {validation_split!r} holds no examples; give it examples or "
                "set validation_split to null"
            )
        if not isinstance(pack_sequences, bool):
            raise ConfigurationError(
                f"pack_sequences must be true or false, got {pack_sequences!r}"
            )
        if preemption_signal not in PREEMPTION_SIGNALS:
            raise ConfigurationError(
                f"preemption_signal must be one of {', '.join(PREEMPTION_SIGNALS)}, "
                f"got {preemption_signal!r}"
            )
        # Fails here, not in a worker, when the batch does not split evenly.
        BatchSchedule(len(dataset_dict[train_split]), batch_size, seed, device_count, 0, grad_accum)
        devices = _devices(device_count)
        config = TrainConfig(
            self.unique_id,
            self.work_dir,
            step_name=self.name,
            train_split=train_split,
            validation_split=validation_split,
            seed=seed,
            train_steps=train_steps,
            grad_accum=grad_accum,
            log_every=log_every,
            checkpoint_every=checkpoint_every,
            validate_every=validate_every,
            is_distributed=device_count > 1,
            devices=devices,
            distributed_port=distributed_port or free_port(),
            world_size=device_count,
        )
        run_training(
            TrainPlan(
                config,
                model,
                engine,
                dataset_dict,
                batch_size,
                eval_batch_size,
                signal.Signals[preemption_signal],
                collective_timeout_s,
                pack_sequences,
            )
        )

        trained = model.construct()
        assert isinstance(trained, ModelWrapper)
        state = torch.load(self.work_dir / FINAL_WEIGHTS, map_location="cpu", weights_only=True)
        trained.load_state_dict(state)  # strict: every key of the consolidated model must match
        trained.training_log = read_training_log(self.work_dir / TRAINING_LOG)
        return trained


def _devices(device_count: int) -> list[int]:
    """Each process's GPU index, or ``-1`` (CPU) for every process when there is no GPU.

    Under a launcher (``python -m tango_fairscale run``), the launcher's world size must be
    ``device_count`` and the list holds this process's own device (each process reads only its
    entry).
    """
    launch = launcher.current()
    if launch is not None:
        world_size = launch.environment.world_size
        if device_count != world_size:
            raise ConfigurationError(
                f"device_count {device_count} disagrees with the launcher's {world_size} "
                f"processes (WORLD_SIZE); set -D device_count={world_size}"
            )
        return [launch.environment.local_device()] * device_count
    environment = launcher.LaunchEnvironment.from_environ()
    if environment is not None and environment.world_size > 1:
        raise ConfigurationError(
            f"this process is one of {environment.world_size} started by a launcher "
            "(WORLD_SIZE is set): start them with 'python -m tango_fairscale run ...' instead "
            "of 'tango run ...'"
        )
    if torch.cuda.is_available():
        visible = torch.cuda.device_count()
        if device_count > visible:
            raise ConfigurationError(
                f"device_count {device_count} exceeds the {visible} visible GPUs; lower "
                "device_count or set CUDA_VISIBLE_DEVICES"
            )
        return list(range(device_count))
    return [-1] * device_count


class TrainingStopped(RuntimeError):
    """Training stopped before the last step; its newest checkpoint is intact and resumable."""


def run_training(plan: TrainPlan) -> None:
    """Train in ``plan.config.work_dir`` (resuming from its newest checkpoint) on every device.

    With several processes, the preemption signal received here is passed on to every worker,
    and a worker that dies or fails stops the others at once (one-line error naming it). Under
    an external launcher (:mod:`tango_fairscale.launcher`), the processes already exist: this one
    (rank 0) hands the plan to the others and trains as rank 0.
    """
    plan.config.work_dir.mkdir(parents=True, exist_ok=True)
    launch = launcher.current()
    if launch is not None:  # the launcher started every process: this is rank 0
        job = launch.publish(plan.config.work_dir, plan)
        _worker(launch.rank, plan, launch.job_store(job))
        return
    if plan.config.world_size == 1:
        _worker(0, plan)
        return
    import torch.multiprocessing as mp

    context = mp.start_processes(
        _spawned_worker,
        args=(plan,),
        nprocs=plan.config.world_size,
        join=False,
        start_method="spawn",
    )

    def forward_signal(signum: int, frame: Any) -> None:
        for process in context.processes:
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signum)

    previous = signal.signal(plan.preemption_signal, forward_signal)
    try:
        while not context.join(grace_period=5):
            pass
    except mp.ProcessExitedException as error:
        raise TrainingStopped(
            f"training process {error.error_index} died ({error.signal_name or error.exit_code}); "
            f"the others were stopped; {_resume_hint(plan)}"
        ) from None
    except mp.ProcessRaisedException as error:
        reason = [line for line in str(error).splitlines() if line.strip()][-1]
        raise TrainingStopped(f"training process {error.error_index} failed: {reason}") from None
    finally:
        signal.signal(plan.preemption_signal, previous)


def _resume_hint(plan: TrainPlan) -> str:
    latest = plan.checkpoints / "latest"
    where = f"checkpoint {latest.read_text().strip()}" if latest.is_file() else "the start"
    return f"rerun the same command to resume from {where}"


def join_training(launch: launcher.Launch, job: int, plan: TrainPlan) -> None:
    """A launched rank other than 0: train ``plan`` (published by rank 0) on this node's device."""
    plan.config.devices = [launch.environment.local_device()] * plan.config.world_size
    _worker(launch.rank, plan, launch.job_store(job))


def _spawned_worker(rank: int, plan: TrainPlan) -> None:
    if os.environ.get(EnvVarNames.LOGGING_PORT.value):
        # Under `tango run`: send this worker's log records to the main process.
        initialize_worker_logging(rank)
    _worker(rank, plan)


def _worker(rank: int, plan: TrainPlan, store: dist.Store | None = None) -> None:
    """One training process: build the engine, resume, train, validate, checkpoint, consolidate.

    ``store``: where the process group meets (a launcher's); by default the train config's
    address and port.
    """
    config = plan.config
    config.worker_id = rank
    torch.manual_seed(config.seed)
    # Joined here, before the engine, so that every collective is bounded by the timeout.
    init_process_group(config, timeout=timedelta(seconds=plan.collective_timeout_s), store=store)
    engine = plan.engine.construct(train_config=config, model=plan.model)
    if not isinstance(engine, Engine):
        raise ConfigurationError(
            f"'engine' must be a tango_fairscale engine, got {type(engine).__name__}"
        )
    try:
        _train(engine, plan)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _train(engine: Engine, plan: TrainPlan) -> None:
    config = plan.config
    is_main = config.is_local_main_process
    model = engine.wrapped_model
    if plan.pack_sequences and not engine.accepts_packed_batches:
        raise ConfigurationError(
            f"pack_sequences needs an engine whose model takes packed batches; "
            f"{type(engine).__name__} with attention {model.model.config._attn_implementation!r} "
            "does not (the pipe engine never does): set pack_sequences to false"
        )
    examples = list(plan.dataset_dict[config.train_split])
    queries = training_queries(examples, model.tokenizer, model.max_length)
    schedule = BatchSchedule(
        len(queries),
        plan.batch_size,
        config.seed,
        config.world_size,
        config.worker_id,
        config.grad_accum,
    )
    assert config.train_steps is not None
    start = _resume(engine, plan)
    log = TrainingLog(config.work_dir / TRAINING_LOG, enabled=is_main)
    if start:
        logger.info("resumed from the checkpoint at step %d", start)

    engine.model.train()
    progress = Tqdm.tqdm(
        range(start, config.train_steps),
        desc="Training",
        initial=start,
        total=config.train_steps,
        disable=not is_main,
    )
    guard = NonFiniteGuard(engine, schedule)
    preemption = Preemption(plan.preemption_signal)
    try:
        _run_steps(engine, plan, queries, schedule, start, guard, preemption, progress, log)
    finally:
        preemption.restore()

    state = engine.full_model_state()
    if is_main:
        assert state is not None
        target = config.work_dir / FINAL_WEIGHTS
        torch.save(state, target.with_suffix(".tmp"))
        os.replace(target.with_suffix(".tmp"), target)
    _barrier()


def _run_steps(
    engine: Engine,
    plan: TrainPlan,
    queries: list,
    schedule: BatchSchedule,
    start: int,
    guard: NonFiniteGuard,
    preemption: Preemption,
    progress: Any,
    log: TrainingLog,
) -> None:
    config = plan.config
    assert config.train_steps is not None
    model = engine.wrapped_model
    for step in progress:
        step_loss = torch.zeros((), device=engine.device)
        micro_batches = schedule.micro_batches(step)
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
        engine.step()
        done = step + 1
        guard.update(done, step_loss)
        checkpoint_now = done % config.checkpoint_every == 0 or done == config.train_steps
        preempted = False
        if done % config.log_every == 0 or done == 1 or checkpoint_now:
            # Agreed by all ranks, before logging, validating or checkpointing a broken model.
            preempted = guard.check(preemption.received)
            mean_loss = _mean_over_ranks(step_loss)
            lr = engine.optimizer.param_groups[0]["lr"]
            log.write({"step": done, "train_loss": mean_loss, "lr": lr})
            progress.set_postfix(loss=f"{mean_loss:.4f}")
        if preempted:
            _save_checkpoint(engine, plan, done)
            raise TrainingStopped(
                f"preempted by {preemption.signal.name} after step {done}; {_resume_hint(plan)}"
            )
        if config.validation_split is not None and (
            done == config.train_steps
            or (config.validate_every is not None and done % config.validate_every == 0)
        ):
            metrics = _validate(engine, plan)
            log.write({"step": done, **{f"val_{k}": v for k, v in metrics.items()}})
            if config.is_local_main_process:
                logger.info(
                    "step %d: validation acc %.4f, acc_norm %.4f",
                    done,
                    metrics["acc"],
                    metrics["acc_norm"],
                )
        if checkpoint_now:
            _save_checkpoint(engine, plan, done)


class NonFiniteLossError(RuntimeError):
    """Training produced non-finite losses for longer than the engine tolerates."""


class NonFiniteGuard:
    """Tracks non-finite losses on the device (no host synchronisation per step).

    Under ``16-mixed`` the grad scaler skips overflowing steps, and up to
    ``SCALER_TOLERANCE`` consecutive non-finite losses are tolerated; otherwise one non-finite
    loss is already fatal (the optimizer has applied it). :meth:`check`, called on every rank at
    log and checkpoint steps, raises before a broken model is checkpointed.
    """

    SCALER_TOLERANCE = 10

    def __init__(self, engine: Engine, schedule: BatchSchedule) -> None:
        self.bound = self.SCALER_TOLERANCE if engine.grad_scaler is not None else 0
        self.schedule = schedule
        device = engine.device
        self.streak = torch.zeros((), dtype=torch.long, device=device)
        # [longest streak so far, first step of the first streak past the bound]
        self.worst = torch.zeros(2, dtype=torch.long, device=device)

    def update(self, step: int, loss: torch.Tensor) -> None:
        bad = (~torch.isfinite(loss)).long()
        self.streak = (self.streak + 1) * bad
        past_bound = (self.streak > self.bound) & (self.worst[1] == 0)
        self.worst[1] = torch.where(past_bound, step - self.bound, self.worst[1])
        self.worst[0] = torch.maximum(self.worst[0], self.streak)

    def check(self, preempted: bool = False) -> bool:
        """Raise if the losses broke; return whether any rank was asked to stop (one collective)."""
        flags = torch.cat([self.worst, self.worst.new_tensor([int(preempted)])])
        if dist.is_initialized():
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        longest, first, stop = (int(v) for v in flags.tolist())
        if longest > self.bound:
            examples = self.schedule.global_batch(first - 1)
            raise NonFiniteLossError(
                f"non-finite loss at step {first} ({longest} step(s) in a row, "
                f"{self.bound} tolerated); its training examples: {examples}; training stopped, "
                "its last checkpoint is kept — lower lr, set max_grad_norm, or use 32-true"
            )
        return bool(stop)


class Preemption:
    """Records the preemption signal (SIGTERM by default) instead of dying on it.

    The loop then stops every rank at the same step, checkpoints and exits with
    :class:`TrainingStopped`; the previous handler is restored afterwards.
    """

    def __init__(self, signum: signal.Signals) -> None:
        self.signal = signum
        self.received = False
        # Handlers can only be set from the main thread (an executor may run steps elsewhere).
        self._installed = threading.current_thread() is threading.main_thread()
        if self._installed:
            self._previous = signal.signal(signum, self._record)

    def _record(self, signum: int, frame: Any) -> None:
        self.received = True

    def restore(self) -> None:
        if self._installed:
            signal.signal(self.signal, self._previous)


def _validate(engine: Engine, plan: TrainPlan) -> dict[str, Any]:
    config = plan.config
    assert config.validation_split is not None
    model = engine.wrapped_model
    engine.model.eval()
    try:
        return validate_all_ranks(
            engine.forward_eval,
            list(plan.dataset_dict[config.validation_split]),
            model.tokenizer,
            max_length=model.max_length,
            batch_size=plan.eval_batch_size,
            device=engine.device,
            packed=plan.pack_sequences,
            progress=config.is_local_main_process,
        )
    finally:
        engine.model.train()


def _mean_over_ranks(value: torch.Tensor) -> float:
    if dist.is_initialized():
        value = value.clone()
        dist.all_reduce(value)
        value /= dist.get_world_size()
    return float(value.item())


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


# --- checkpoints ------------------------------------------------------------------------------
# checkpoints/step0000100/   complete checkpoints (renamed into place when all ranks are done)
# checkpoints/.partial-.../  being written; never read, removed on the next start
# checkpoints/latest         the name of the newest complete checkpoint, replaced atomically


def _save_checkpoint(engine: Engine, plan: TrainPlan, step: int) -> None:
    name = f"step{step:07d}"
    partial = plan.checkpoints / f".partial-{name}"
    client_state = {"step": step, "rng": torch.get_rng_state()}
    try:
        engine.save_checkpoint(partial, client_state)
    except OSError as error:  # a full disk, a lost mount: the previous checkpoint is untouched
        raise TrainingStopped(
            f"writing checkpoint {name} failed ({error}); {_resume_hint(plan)} once it can be "
            "written"
        ) from None
    _barrier()
    if plan.config.is_local_main_process:
        final = plan.checkpoints / name
        if final.exists():
            shutil.rmtree(final)
        os.replace(partial, final)
        _write_atomically(plan.checkpoints / "latest", name)
        for old in plan.checkpoints.glob("step*"):
            if old.name != name:
                shutil.rmtree(old)
    _barrier()


def _resume(engine: Engine, plan: TrainPlan) -> int:
    """Load the newest complete checkpoint; return its step (0 when there is none)."""
    latest = plan.checkpoints / "latest"
    if plan.config.is_local_main_process:
        for partial in plan.checkpoints.glob(".partial-*"):
            shutil.rmtree(partial)
    _barrier()
    if not latest.is_file():
        return 0
    directory = plan.checkpoints / latest.read_text().strip()
    try:
        client_state = engine.load_checkpoint(directory)
    except ConfigurationError:
        raise
    except Exception as error:  # truncated, corrupted, foreign or unsafe (pickled code) files
        reason = " ".join(str(error).split())[:300]
        raise ConfigurationError(
            f"checkpoint {directory} cannot be loaded ({type(error).__name__}: {reason}); "
            f"delete {plan.checkpoints} to start this step over"
        ) from None
    torch.set_rng_state(client_state["rng"])
    return int(client_state["step"])


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


# --- the training log -------------------------------------------------------------------------


class TrainingLog:
    """Append-only JSON lines ``{"step": ..., <metric>: ...}`` written by rank 0."""

    def __init__(self, path: Path, enabled: bool) -> None:
        self.path = path
        self.enabled = enabled

    def write(self, record: dict[str, Any]) -> None:
        if self.enabled:
            with self.path.open("a") as file:
                file.write(json.dumps(record) + "\n")


def read_training_log(path: Path) -> list[dict[str, Any]]:
    """The log's records by step; a step logged twice (replayed after a resume) keeps the last."""
    if not path.is_file():
        return []
    merged: dict[int, dict[str, Any]] = {}
    for record in _json_lines(path.read_text().splitlines()):
        merged.setdefault(record["step"], {}).update(record)
    return [merged[step] for step in sorted(merged)]


def _json_lines(lines: Iterable[str]) -> Iterable[dict[str, Any]]:
    for line in lines:
        if line.strip():
            yield json.loads(line)
