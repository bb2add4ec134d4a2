"""The ``tango_fairscale::train`` step: its config checked and made into a plan
(:mod:`~tango_fairscale.train.settings`), the plan trained on every device
(:mod:`~tango_fairscale.train.launch`), the trained model returned and, once the run finished,
its files given back."""

from __future__ import annotations

import inspect
import logging
import time
from pathlib import Path
from typing import Any

from tango import Format, Step
from tango.common import Lazy
from tango.common.exceptions import ConfigurationError
from tango.integrations.torch import Model, TrainCallback, TrainingEngine
from tango.step import StepResources

from ..compat import check_engine_config, registered_engine  # (and Tango's fixes)
from ..evaluation.call import GenerationSettings
from ..model.causal_lm import ModelWrapper
from ..model.fingerprint import FingerprintedLazy
from ..model.loading import weights_loaded_over
from ..parallel.consolidate import full_state_dict
from ..parallel.model_only import finish_work_dir
from ..parallel.precision import auto_precision_key
from ..parallel.safe_load import load_torch_file
from ..records.checkpoints import CheckpointError
from ..records.retention import finished_checkpoint
from ..records.training_log import TRAINING_LOG, read_training_log
from ..tasks.lm_eval import TaskSpec
from ..tasks.requests import unique_id_with
from .format import ModelFormat
from .launch import run_training
from .loop import FINAL_WEIGHTS, TrainPlan
from .plan import DEFAULT_RUNTIME, TrainRuntime
from .settings import TrainComponents, TrainSettings, training_data

logger = logging.getLogger(__name__)

#: The ``run`` arguments that make :class:`~.settings.TrainSettings` (its ``of``'s, by name).
_SETTINGS = tuple(inspect.signature(TrainSettings.of).parameters)


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
    :param runtime: how the run is carried out, not what it computes
        (:class:`~tango_fairscale.train.plan.TrainRuntime`: ``device_count``, ``log_every``,
        ``checkpoint_every``, ``keep_checkpoints``, ``keep_optimizer_state``,
        ``pack_sequences``, ``eval_batch_size``, ``distributed_port``, ``preemption_signal``,
        ``collective_timeout_s``); one argument, not part of the cache key.
    :param max_gen_toks: for validation tasks that generate text (``generate_until``) and set no
        ``max_gen_toks`` of their own, the most tokens generated (lm-eval's default, 256).
    :param generation_seed: seeds sampling, for validation tasks that sample.

    Returns the trained model (fp32 weights, whatever the checkpoint and precision: a
    ``bf16-true`` run's bf16 values, upcast exactly); its ``training_log`` holds the logged loss
    and validation metrics by step, and its Tango hash is this step's unique id.

    The ``runtime`` block is not part of the cache key: 1 or 8 devices, packed or not, any
    cadence of logs and checkpoints train the same model (up to float rounding). The model's files
    are (:meth:`massage_kwargs`): a model directory changed in place trains again.

    Example (Jsonnet)::

        trained_model: {type: "tango_fairscale::train", model: {...},
                        task: {name: "piqa", dataset: {ref: "piqa"}},
                        validate_tasks: ["piqa", "arc_easy"],
                        engine: {type: "tango_fairscale::ddp", optimizer: {type: "torch::AdamW"}},
                        train_steps: 2000, batch_size: 16, runtime: {device_count: 2}}
    """

    VERSION = "005"
    DETERMINISTIC = True
    CACHEABLE = True
    FORMAT: Format = ModelFormat()
    # The result does not depend on the number of devices (the batch is global), so a run may be
    # resumed on another number of devices where the engine can reshard its checkpoints.
    SKIP_ID_ARGUMENTS = {"runtime"}

    @classmethod
    def massage_kwargs(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The settings and the engine block checked when the step is built, before any step runs
        (:meth:`~tango_fairscale.parallel.engine.Engine.check_config`); the model's cache key
        holds the fingerprint of its files, not just their path
        (:class:`~tango_fairscale.model.fingerprint.FingerprintedLazy`)."""
        runtime = kwargs.get("runtime", DEFAULT_RUNTIME)
        if isinstance(runtime, TrainRuntime):
            check_engine_config(kwargs.get("engine"), runtime.device_count)
        arguments = inspect.signature(cls.run).parameters
        settings = {name: kwargs.get(name, arguments[name].default) for name in _SETTINGS}
        if not any(isinstance(v, Step) or v is inspect.Parameter.empty for v in settings.values()):
            TrainSettings.of(**settings)
        model = kwargs.get("model")
        if isinstance(model, Lazy) and not isinstance(model, FingerprintedLazy):
            kwargs = {**kwargs, "model": FingerprintedLazy.of(model)}
        return kwargs

    @property
    def unique_id(self) -> str:
        """Tango's unique id, with the engine's precision ``auto`` as what it means here
        (:func:`~tango_fairscale.parallel.precision.auto_precision_key`)."""
        if self.unique_id_cache is not None:  # Tango asks at every hash of the step
            return self.unique_id_cache
        if engine_precision(self.kwargs.get("engine")) != "auto":
            return super().unique_id
        return unique_id_with(self, lambda: {"engine_precision": auto_precision_key()})

    @property
    def resources(self) -> StepResources:
        runtime = self.kwargs.get("runtime")
        devices = runtime.device_count if isinstance(runtime, TrainRuntime) else 1
        return self.step_resources or StepResources(gpu_count=devices)

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
        max_gen_toks: int = GenerationSettings.max_gen_toks,
        generation_seed: int = GenerationSettings.seed,
        runtime: TrainRuntime = DEFAULT_RUNTIME,
    ) -> ModelWrapper:
        settings = TrainSettings.of(
            train_steps, batch_size, grad_accum, seed, validate_every, max_gen_toks, generation_seed
        )
        components = TrainComponents(model, engine, list(callbacks or []), val_metric)
        started = time.perf_counter()
        pairs, validation = training_data(task, validate_tasks, engine)
        plan = settings.plan(self, runtime, components, pairs, validation)
        plan.data_seconds = time.perf_counter() - started
        return self._trained_model(plan, model, runtime.keep_optimizer_state)

    def _trained_model(
        self, plan: TrainPlan, model: Lazy[Model], keep_optimizer_state: bool
    ) -> ModelWrapper:
        """``plan``'s model: trained now, or, when the run finished but its result was not
        stored, read from its final checkpoint; then the run's files given back."""
        finished = finished_checkpoint(plan.checkpoints)
        if finished is None:
            state = run_training(plan)
            if state is None:  # a spawned rank 0 wrote it
                state = load_torch_file(self.work_dir / FINAL_WEIGHTS)
        else:  # the run finished, its result was not stored: its final checkpoint holds the model
            state = finished_model_state(finished)
        with weights_loaded_over():  # a random model's initialisation would be overwritten
            trained = model.construct()
        assert isinstance(trained, ModelWrapper)
        trained.load_state_dict(state)  # strict: every key of the consolidated model must match
        trained.training_log = read_training_log(self.work_dir / TRAINING_LOG)
        trained.origin = ("tango_fairscale::train", self.unique_id)  # no longer its base model
        give_back_work_dir(self.work_dir, keep_optimizer_state)
        return trained


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


def engine_precision(engine: Any) -> str | None:
    """The precision an engine config (a ``Lazy``) names, else its engine's default; ``None``
    for an engine that takes none."""
    registered = registered_engine(engine)
    if registered is None:
        return None
    engine_class, fields = registered
    parameter = inspect.signature(engine_class).parameters.get("precision")
    default = None if parameter is None else parameter.default
    return fields.get("precision", default)
