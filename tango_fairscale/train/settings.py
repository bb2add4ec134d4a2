"""The training step's config checked before any process starts, in one line per problem, and made
into the plan every training process follows (:class:`~tango_fairscale.train.loop.TrainPlan`):
its settings, its training pairs and its validation tasks."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

from tango import Step
from tango.common import Lazy
from tango.common.exceptions import ConfigurationError
from tango.integrations.torch import Model, TrainCallback, TrainConfig, TrainingEngine

from ..checks import boolean, one_of, positive_int, positive_ints
from ..data.schedules import BatchSchedule
from ..evaluation.call import GenerationSettings
from ..runtime.devices import job_devices
from ..runtime.signals import PREEMPTION_SIGNALS
from ..tasks.lm_eval import TaskSpec, load_tasks, training_pairs
from .launch import component_modules
from .loop import TrainPlan


@dataclass
class TrainSettings:
    """The training step's settings (its ``run`` arguments of the same names, documented there),
    checked when built."""

    train_steps: int
    batch_size: int
    grad_accum: int
    seed: int
    validate_every: int | None
    checkpoint_every: int
    keep_checkpoints: int
    keep_optimizer_state: bool
    device_count: int
    log_every: int
    eval_batch_size: int
    distributed_port: int | None
    preemption_signal: str
    collective_timeout_s: int
    pack_sequences: bool | None
    max_gen_toks: int
    generation_seed: int
    generation: GenerationSettings = field(init=False)

    def __post_init__(self) -> None:
        positive_ints(
            {
                "train_steps": self.train_steps,
                "batch_size": self.batch_size,
                "grad_accum": self.grad_accum,
                "checkpoint_every": self.checkpoint_every,
                "keep_checkpoints": self.keep_checkpoints,
                "device_count": self.device_count,
                "log_every": self.log_every,
                "eval_batch_size": self.eval_batch_size,
                "collective_timeout_s": self.collective_timeout_s,
            }
        )
        positive_int("validate_every", self.validate_every, optional=True)
        if self.pack_sequences is not None:
            boolean("pack_sequences", self.pack_sequences)
        boolean("keep_optimizer_state", self.keep_optimizer_state)
        one_of("preemption_signal", self.preemption_signal, PREEMPTION_SIGNALS)
        self.generation = GenerationSettings(self.max_gen_toks, self.generation_seed)

    def plan(
        self,
        step: Step,
        model: Lazy[Model],
        engine: Lazy[TrainingEngine],
        pairs: list[tuple[str, str]],
        validation: list[TaskSpec],
        callbacks: list[Lazy[TrainCallback]],
        val_metric: str | None,
    ) -> TrainPlan:
        """The plan that trains ``model`` on ``pairs`` with these settings in ``step``'s work
        dir; refused here, not in a worker, when the batch does not split evenly."""
        BatchSchedule(len(pairs), self.batch_size, self.seed, self.device_count, 0, self.grad_accum)
        config = TrainConfig(
            step.unique_id,
            step.work_dir,
            step_name=step.name,
            seed=self.seed,
            train_steps=self.train_steps,
            grad_accum=self.grad_accum,
            log_every=self.log_every,
            checkpoint_every=self.checkpoint_every,
            validate_every=self.validate_every,
            is_distributed=self.device_count > 1,
            devices=job_devices(self.device_count),
            distributed_port=self.distributed_port or 0,  # 0: a free port, bound before the spawn
            world_size=self.device_count,
        )
        return TrainPlan(
            config,
            model,
            engine,
            pairs,
            validation,
            self.batch_size,
            self.eval_batch_size,
            signal.Signals[self.preemption_signal],
            self.collective_timeout_s,
            self.pack_sequences,
            component_modules(model, engine, *callbacks),
            callbacks,
            step.workspace,
            val_metric,
            keep_checkpoints=self.keep_checkpoints,
            generation=self.generation,
            final_weights_to_file=False,
        )


def training_data(
    task: TaskSpec, validate_tasks: list[TaskSpec] | None, engine: Lazy[TrainingEngine]
) -> tuple[list[tuple[str, str]], list[TaskSpec]]:
    """The training pairs of ``task`` and the tasks validated on (default: ``task``), each loaded
    here, before any process starts, so that one that cannot load is refused at once."""
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
    for spec in validation:
        refuse_generation(engine, load_tasks(spec))
    return pairs, validation


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
