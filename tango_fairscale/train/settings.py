"""The training step's config checked before any process starts, in one line per problem, and made
into the plan every training process follows (:class:`~tango_fairscale.train.plan.TrainPlan`):
its settings, its training pairs and its validation tasks."""

from __future__ import annotations

from dataclasses import dataclass

from tango import Step
from tango.common import Lazy
from tango.common.exceptions import ConfigurationError
from tango.integrations.torch import Model, TrainCallback, TrainConfig, TrainingEngine

from ..checks import integer, positive_int, positive_ints
from ..compat import registered_engine
from ..data.schedules import BatchSchedule
from ..evaluation.call import GenerationSettings
from ..runtime.devices import job_devices
from ..tasks.lm_eval import TaskSpec, load_tasks
from ..tasks.training_pairs import training_pairs
from .launch import component_modules
from .plan import TrainPlan, TrainRuntime


@dataclass(frozen=True)
class TrainSettings:
    """What the training step computes (its ``run`` arguments of the same names, documented
    there, all in its cache key), checked when built."""

    train_steps: int
    batch_size: int
    grad_accum: int
    seed: int
    validate_every: int | None
    generation: GenerationSettings

    def __post_init__(self) -> None:
        positive_ints(
            {
                "train_steps": self.train_steps,
                "batch_size": self.batch_size,
                "grad_accum": self.grad_accum,
            }
        )
        integer("seed", self.seed)
        positive_int("validate_every", self.validate_every, optional=True)

    @classmethod
    def of(
        cls,
        train_steps: int,
        batch_size: int,
        grad_accum: int,
        seed: int,
        validate_every: int | None,
        max_gen_toks: int,
        generation_seed: int,
    ) -> TrainSettings:
        """The settings of the training step's ``run`` arguments of the same names, checked."""
        generation = GenerationSettings(max_gen_toks, generation_seed)
        return cls(train_steps, batch_size, grad_accum, seed, validate_every, generation)

    def plan(
        self,
        step: Step,
        runtime: TrainRuntime,
        components: TrainComponents,
        pairs: list[tuple[str, str]],
        validation: list[TaskSpec],
    ) -> TrainPlan:
        """The plan that trains ``components`` on ``pairs`` with these settings in ``step``'s
        work dir; refused here, not in a worker, when the batch does not split evenly."""
        try:
            BatchSchedule(
                len(pairs), self.batch_size, self.seed, runtime.device_count, 0, self.grad_accum
            )
        except ValueError as error:  # too few examples for one batch, or an uneven split
            raise ConfigurationError(str(error)) from None
        config = TrainConfig(
            step.unique_id,
            step.work_dir,
            step_name=step.name,
            seed=self.seed,
            train_steps=self.train_steps,
            grad_accum=self.grad_accum,
            log_every=runtime.log_every,
            checkpoint_every=runtime.checkpoint_every,
            validate_every=self.validate_every,
            is_distributed=runtime.device_count > 1,
            devices=job_devices(runtime.device_count),
            distributed_port=runtime.distributed_port or 0,  # 0: a free port, bound before spawning
            world_size=runtime.device_count,
        )
        return TrainPlan(
            config,
            components.model,
            components.engine,
            pairs,
            validation,
            self.batch_size,
            runtime,
            generation=self.generation,
            component_modules=component_modules(
                components.model, components.engine, *components.callbacks
            ),
            callbacks=components.callbacks,
            workspace=step.workspace,
            val_metric=components.val_metric,
            final_weights_to_file=False,
        )


@dataclass(frozen=True)
class TrainComponents:
    """What the training step builds in each process (its model, engine and callbacks, as
    configs) and the validation metric handed to the callbacks."""

    model: Lazy[Model]
    engine: Lazy[TrainingEngine]
    callbacks: list[Lazy[TrainCallback]]
    val_metric: str | None


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
    found = registered_engine(engine)  # an unknown engine is refused where it is built
    if not generating or found is None:
        return
    refusal = getattr(found[0], "generation_refusal", None)
    if refusal is not None:
        raise ConfigurationError(f"validation task {generating[0]!r}: {refusal}")
