"""The ``tango_fairscale::train`` step: checks its config, starts one training process per device
(or hands the run to a launcher's processes) and returns the trained model."""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from typing import Any

from tango import Format, Step
from tango.common import Lazy, Registrable
from tango.common.exceptions import ConfigurationError
from tango.integrations.torch import Model, TrainCallback, TrainConfig, TrainingEngine
from tango.step import StepResources

from .. import compat  # noqa: F401  (Tango fixes)
from ..checks import boolean, one_of, positive_int, positive_ints
from ..data.schedules import BatchSchedule
from ..evaluation.call import GenerationSettings
from ..model.causal_lm import ModelWrapper
from ..model.fingerprint import FingerprintedLazy
from ..parallel.consolidate import full_state_dict
from ..parallel.model_only import finish_work_dir
from ..parallel.safe_load import load_torch_file
from ..records.checkpoints import CheckpointError, run_id
from ..records.retention import finished_checkpoint
from ..runtime import launcher
from ..runtime.devices import job_devices
from ..runtime.process_group import hosted_store
from ..runtime.signals import PREEMPTION_SIGNALS
from ..runtime.spawn import WorkerFailed, run_workers
from ..tasks.lm_eval import TaskSpec, load_tasks, training_pairs
from .checkpoints import TrainingStopped, resume_hint
from .format import ModelFormat
from .log import TRAINING_LOG, read_training_log
from .loop import FINAL_WEIGHTS, TrainPlan, spawned_worker, train_worker

logger = logging.getLogger(__name__)


@Step.register("tango_fairscale::train")
class TrainStep(Step[ModelWrapper]):
    """Fine-tune a :class:`~tango_fairscale.model.causal_lm.ModelWrapper` on a multiple-choice task
    with any engine, validating on lm-eval tasks during training.

    Registered as a Tango ``Step`` under the name ``"tango_fairscale::train"``.

    The objective is rank-classification fine-tuning: the causal-LM loss on the tokens of each
    training document's correct choice, its context formatted as lm-eval formats the task's
    requests (few-shot examples included when the task asks for them).

    :param model: the model to train (constructed inside each worker).
    :param engine: a ``TrainingEngine`` (``tango_fairscale::ddp``, ...) with its optimizer.
    :param task: the training task (a :class:`~tango_fairscale.tasks.lm_eval.TaskSpec`: a
        name, or a name with ``dataset`` / ``data_dir``); its training split is trained on.
    :param train_steps: optimizer steps.
    :param batch_size: examples per optimizer step over all devices (not per device), so the run
        is the same on any number of devices; must divide by ``device_count × grad_accum``.
    :param grad_accum: micro-batches per step on each device.
    :param validate_tasks: tasks scored during training (lm-eval's metrics, logged per task);
        default: the training task itself (its evaluation split); ``[]``: none.
    :param validate_every: validate every this many steps (and after the last), all ranks
        scoring through the engine; ``None`` validates only after the last step.
    :param callbacks: Tango ``TrainCallback`` s (``wandb::log``, ``torch::stop_early``, your
        own), built on every rank and called with the hooks ``torch::train`` calls; the
        validation metric they see is ``val_metric``.
    :param val_metric: the validation summary key handed to callbacks (higher is better), e.g.
        ``"arc_easy/acc"``; default: the first task's first metric.
    :param checkpoint_every: steps between checkpoints; a rerun resumes from the newest one whose
        files match its manifest (sizes and SHA-256 digests, recorded while writing).
    :param keep_checkpoints: complete checkpoints kept while the run trains, the newest ones:
        once a checkpoint is complete, all but the newest ``keep_checkpoints`` are deleted. A
        rerun whose newest checkpoint is damaged (a file missing, truncated, altered, or from
        another checkpoint) resumes from the one before and logs why, so ``1`` leaves nothing to
        fall back to. Once the run finishes, only its final checkpoint is kept.
    :param keep_optimizer_state: keep the optimizer state in the final checkpoint of a finished
        run. By default it is dropped once the run finishes (the checkpoint rewritten model-only,
        verified, with its manifest: it exports to the same weights, it does not resume), as
        are the other checkpoints and the consolidated ``final_weights.pt``: the stored result
        holds the model. GPT-2 124M with AdamW: a 1.5 GB checkpoint becomes 0.5 GB.
    :param device_count: processes, one per GPU (or CPU processes over gloo without GPUs).
    :param preemption_signal: on this signal (``SIGTERM``, ``SIGUSR1``, ...) every rank finishes
        its step, a checkpoint is written and the step fails with :class:`TrainingStopped`;
        rerunning the same command resumes.
    :param collective_timeout_s: a rank that hangs (without dying) makes the others fail after
        this many seconds in a collective, instead of waiting forever.
    :param pack_sequences: feed micro-batches (and validation batches) packed end to end instead
        of right-padded (:func:`~tango_fairscale.data.batches.packed_batch`): the same losses up
        to float rounding, far fewer positions on short data such as PIQA (measured on an H200,
        PIQA batch 16: GPT-2 124M fp32 1.30x the tokens/s in half the memory; GPT-2 1.5B bf16 at
        batch 64: 1.92x in a third of the memory). ``null``: packed where the engine's model
        takes packed batches (``ModelWrapper.supports_packing``; never under the ``pipe``
        engine), else padded; ``true`` is refused where it does not.
    :param max_gen_toks: for validation tasks that generate text (``generate_until``) and set no
        ``max_gen_toks`` of their own, the most tokens generated (lm-eval's default, 256).
    :param generation_seed: seeds sampling, for validation tasks that sample.

    Returns the trained model (fp32 weights, whatever the checkpoint and precision: a
    ``bf16-true`` run's bf16 values, upcast exactly); its ``training_log`` holds the logged loss
    and validation metrics by step, and its Tango hash is this step's unique id.

    ``log_every``, ``eval_batch_size``, ``distributed_port``, ``device_count``,
    ``keep_checkpoints``, ``keep_optimizer_state`` and ``pack_sequences`` are not part of the
    cache key: 1 or 8 devices,
    packed or not, train the same model (up to float rounding). The model's files are
    (:meth:`massage_kwargs`): a model directory changed in place trains again.

    Example (Jsonnet)::

        trained_model: {type: "tango_fairscale::train", model: {...},
                        task: {name: "piqa", dataset: {ref: "piqa"}},
                        validate_tasks: ["piqa", "arc_easy"],
                        engine: {type: "tango_fairscale::ddp", optimizer: {type: "torch::AdamW"}},
                        train_steps: 2000, batch_size: 16, device_count: 2}
    """

    VERSION = "002"
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
        "keep_checkpoints",
        "keep_optimizer_state",
    }

    @classmethod
    def massage_kwargs(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The model's cache key holds the fingerprint of its files, not just their path
        (:class:`~tango_fairscale.model.fingerprint.FingerprintedLazy`)."""
        model = kwargs.get("model")
        if isinstance(model, Lazy) and not isinstance(model, FingerprintedLazy):
            kwargs = {**kwargs, "model": FingerprintedLazy.of(model)}
        return kwargs

    @property
    def resources(self) -> StepResources:
        return self.step_resources or StepResources(gpu_count=self.kwargs.get("device_count", 1))

    def run(  # type: ignore[override]
        self,
        model: Lazy[Model],
        engine: Lazy[TrainingEngine],
        task: TaskSpec,
        *,
        train_steps: int,
        batch_size: int = 16,
        grad_accum: int = 1,
        seed: int = 42,
        validate_tasks: list[TaskSpec] | None = None,
        validate_every: int | None = None,
        callbacks: list[Lazy[TrainCallback]] | None = None,
        val_metric: str | None = None,
        checkpoint_every: int = 100,
        keep_checkpoints: int = 2,
        keep_optimizer_state: bool = False,
        device_count: int = 1,
        log_every: int = 10,
        eval_batch_size: int = 32,
        distributed_port: int | None = None,
        preemption_signal: str = "SIGTERM",
        collective_timeout_s: int = 600,
        pack_sequences: bool | None = False,
        max_gen_toks: int = GenerationSettings.max_gen_toks,
        generation_seed: int = GenerationSettings.seed,
    ) -> ModelWrapper:
        positive_ints(
            {
                "train_steps": train_steps,
                "batch_size": batch_size,
                "grad_accum": grad_accum,
                "checkpoint_every": checkpoint_every,
                "keep_checkpoints": keep_checkpoints,
                "device_count": device_count,
                "log_every": log_every,
                "eval_batch_size": eval_batch_size,
                "collective_timeout_s": collective_timeout_s,
            }
        )
        positive_int("validate_every", validate_every, optional=True)
        if pack_sequences is not None:
            boolean("pack_sequences", pack_sequences)
        boolean("keep_optimizer_state", keep_optimizer_state)
        one_of("preemption_signal", preemption_signal, PREEMPTION_SIGNALS)
        generation = GenerationSettings(max_gen_toks, generation_seed)
        if task.apply_chat_template or task.system_instruction is not None:
            raise ConfigurationError(
                "the training task's examples are formatted without a chat template or system "
                "instruction: set apply_chat_template / system_instruction on validate_tasks only"
            )
        pairs = [
            pair
            for name, loaded in load_tasks(task, training=True)["tasks"].items()
            for pair in training_pairs(loaded, name)
        ]
        validation = [task] if validate_tasks is None else list(validate_tasks)
        for spec in validation:  # refused here, before any process starts, when they cannot load
            refuse_generation(engine, load_tasks(spec))
        # Fails here, not in a worker, when the batch does not split evenly.
        BatchSchedule(len(pairs), batch_size, seed, device_count, 0, grad_accum)
        devices = job_devices(device_count)
        config = TrainConfig(
            self.unique_id,
            self.work_dir,
            step_name=self.name,
            seed=seed,
            train_steps=train_steps,
            grad_accum=grad_accum,
            log_every=log_every,
            checkpoint_every=checkpoint_every,
            validate_every=validate_every,
            is_distributed=device_count > 1,
            devices=devices,
            distributed_port=distributed_port or 0,  # 0: a free port, bound before the spawn
            world_size=device_count,
        )
        plan = TrainPlan(
            config,
            model,
            engine,
            pairs,
            validation,
            batch_size,
            eval_batch_size,
            signal.Signals[preemption_signal],
            collective_timeout_s,
            pack_sequences,
            component_modules(model, engine, *(callbacks or [])),
            list(callbacks or []),
            self.workspace,
            val_metric,
            keep_checkpoints=keep_checkpoints,
            generation=generation,
        )
        finished = finished_checkpoint(plan.checkpoints)
        if finished is None:
            run_training(plan)
            state = load_torch_file(self.work_dir / FINAL_WEIGHTS)
        else:  # the run finished, its result was not stored: its final checkpoint holds the model
            state = finished_model_state(finished)
        trained = model.construct()
        assert isinstance(trained, ModelWrapper)
        trained.load_state_dict(state)  # strict: every key of the consolidated model must match
        trained.training_log = read_training_log(self.work_dir / TRAINING_LOG)
        trained.origin = ("tango_fairscale::train", self.unique_id)  # no longer its base model
        give_back_work_dir(self.work_dir, keep_optimizer_state)
        return trained


def refuse_generation(engine: Lazy[TrainingEngine], loaded: dict) -> None:
    """Refuse a validation task that generates text under an engine that cannot generate."""
    generating = [n for n, t in loaded["tasks"].items() if t.OUTPUT_TYPE == "generate_until"]
    name = engine._params.get("type")
    if not generating or not isinstance(name, str):
        return
    try:
        engine_class = TrainingEngine.resolve_class_name(name)[0]
    except ConfigurationError:  # an unknown engine is refused where it is built
        return
    refusal = getattr(engine_class, "generation_refusal", None)
    if refusal is not None:
        raise ConfigurationError(f"validation task {generating[0]!r}: {refusal}")


def component_modules(*components: Lazy) -> tuple[str, ...]:
    """The modules that register the types ``components`` (``Lazy``) name, theirs and their
    parameters' (an engine's optimizer and scheduler, ...), for processes that start without
    them: every module defining a registered class whose name appears as a ``type``."""
    names: set[str] = set()

    def collect(value: Any) -> None:
        if isinstance(value, dict):
            if isinstance(value.get("type"), str):
                names.add(value["type"])
            for item in value.values():
                collect(item)
        elif isinstance(value, list):
            for item in value:
                collect(item)

    for component in components:
        collect(component._params.as_dict(quiet=True))
    modules = []
    for registry in Registrable._registry.values():
        for name, (cls, _) in registry.items():
            if name in names:
                modules.append(cls.__module__)
    return tuple(dict.fromkeys(modules))


def finished_model_state(checkpoint: Path) -> dict[str, Any]:
    """The model of a finished run's final checkpoint (model-only), verified; one line if it
    cannot be read."""
    try:
        return full_state_dict(checkpoint)
    except CheckpointError as error:
        raise ConfigurationError(
            f"checkpoint {checkpoint}, the final model of this finished step, cannot be loaded "
            f"({error}); delete {checkpoint.parent} to train this step again"
        ) from None


def give_back_work_dir(work_dir: Path, keep_optimizer_state: bool) -> None:
    """Once a run finished: keep its final checkpoint only, without its optimizer state unless
    ``keep_optimizer_state``, and delete ``final_weights.pt``
    (:func:`~tango_fairscale.parallel.model_only.finish_work_dir`). A failure is logged: the
    trained model is in hand, and every file left is intact."""
    try:
        freed = finish_work_dir(work_dir, keep_optimizer_state)
    except (CheckpointError, OSError) as error:
        logger.warning("the finished run's files were left as they are: %s", error)
        return
    if freed:
        logger.info(
            "freed %.1f MB of checkpoints and weights the stored model makes redundant", freed / 1e6
        )


def run_training(plan: TrainPlan) -> None:
    """Train in ``plan.config.work_dir`` (resuming from its newest checkpoint) on every device.

    One device trains in this process; several are spawned processes, to which the preemption
    signal received here is passed on (a worker that dies or fails stops the others at once).
    Under an external launcher (:mod:`tango_fairscale.runtime.launcher`) the processes already
    exist: this one (rank 0) hands the plan to the others and trains as rank 0.
    """
    plan.config.work_dir.mkdir(parents=True, exist_ok=True)
    plan.run_id = run_id(plan.checkpoints)  # made once; every rank's files carry it
    launch = launcher.current()
    if launch is not None:
        job = launch.publish(plan.config.work_dir, plan)
        train_worker(launch.rank, plan, launch.job_store(job))
    elif plan.config.world_size == 1:
        train_worker(0, plan)
    else:
        try:
            with hosted_store(plan.config):
                run_workers(
                    spawned_worker,
                    (plan,),
                    plan.config.world_size,
                    plan.preemption_signal,
                    preload=plan.component_modules,
                )
        except WorkerFailed as error:
            hint = f"; {resume_hint(plan.checkpoints)}" if "died" in str(error) else ""
            raise TrainingStopped(f"{error}{hint}") from error  # the log keeps the worker's


def join_training(launch: launcher.Launch, job: int, plan: TrainPlan) -> None:
    """A launched rank other than 0: train ``plan`` (published by rank 0) on this node's device."""
    plan.config.devices = [launch.environment.local_device()] * plan.config.world_size
    train_worker(launch.rank, plan, launch.job_store(job))
