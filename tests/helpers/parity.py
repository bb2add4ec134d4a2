"""Parity runs: named training configurations that tests compare, trained together per world size.

A test names the runs it reads with ``@pytest.mark.trains(name, ...)`` (or :func:`run_param`
for one parameter of a parametrized test); the session fixture ``trained_run`` (``conftest.py``)
trains every run that the selected tests name, all runs of one world size in one spawned process
group (:func:`helpers.group.train_many`), the first time a test asks for one of them; the
one-process runs train meanwhile in this process.

Runs that nothing resumes train :data:`STEPS` steps, validate once after the last and write only
the checkpoint the loop writes after the last step; tests that resume a run keep their own
checkpoints (``conftest.train_in``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

#: Optimizer steps of a parity run (clipping is active from the first; validated after the last).
STEPS = 10

#: Each GPT-2 block its own sharding unit (the default makes the tiny models' blocks none).
BLOCKS = [r"model\.transformer\.h\.[0-9]+"]


@dataclass
class RunSpec:
    """One training configuration, as ``conftest.train_tiny`` runs it (lm-eval's ``piqa`` over
    ``piqa_small``, global batch 8, AdamW lr 1e-3, clipping at 0.5, fp32, seed 42, a loss logged
    every step), with fewer steps and checkpoints."""

    engine: str  # ddp | fairscale | fsdp2 | pipe
    world_size: int
    #: ``"tiny"`` (``tiny_model_dir``) or a family of ``helpers/families.py``.
    model: str = "tiny"
    train_steps: int = STEPS
    #: ``None``: validate after the last step only.
    validate_every: int | None = None
    #: ``None``: only the checkpoint after the last step (the loop always writes that one).
    checkpoint_every: int | None = None
    pack_sequences: bool | None = False
    engine_params: Mapping[str, Any] = field(default_factory=dict)
    #: ``False``: no validation (for runs whose checkpoints a test reads).
    validate: bool = True


SPECS: dict[str, RunSpec] = {}


def define(name: str, spec: RunSpec) -> str:
    """Register ``spec`` under ``name`` (at import: test modules define their runs)."""
    assert SPECS.get(name, spec) == spec, f"run {name!r} defined twice, differently"
    SPECS[name] = spec
    return name


def trains(*names: str) -> pytest.MarkDecorator:
    """The mark naming the runs a test reads."""
    unknown = [name for name in names if name not in SPECS]
    assert not unknown, f"undefined runs {unknown}"
    return pytest.mark.trains(*names)


def run_param(value: Any, *names: str, id: str, slow: bool = False) -> Any:
    """``pytest.param(value)`` of a test that reads the runs ``names`` (in the slow tier when
    ``slow``)."""
    marks = [trains(*names)] + ([pytest.mark.slow] if slow else [])
    return pytest.param(value, id=id, marks=marks)


#: The references: DDP on 2 processes, padded batches, fp32.
DDP = define("ddp", RunSpec("ddp", 2))
#: 20 steps, validating every 10 and checkpointing every 5: what ``conftest.train_in`` runs do.
DDP_20 = define("ddp-20", RunSpec("ddp", 2, train_steps=20, validate_every=10, checkpoint_every=5))


def build_plan(spec: RunSpec, work_dir: Path, model_dir: Path, dataset: Any) -> Any:
    """The ``TrainPlan`` of ``spec`` in ``work_dir`` (:func:`~helpers.group.train_many` sets its
    port)."""
    from conftest import engine_config
    from tango.common import Lazy, Params
    from tango.integrations.torch import Model, TrainConfig, TrainingEngine

    from tango_fairscale.tasks.lm_eval import TaskSpec, load_tasks
    from tango_fairscale.tasks.training_pairs import training_pairs
    from tango_fairscale.train.launch import component_modules
    from tango_fairscale.train.loop import TrainPlan, TrainRuntime

    config = TrainConfig(
        "test",
        work_dir,
        train_steps=spec.train_steps,
        checkpoint_every=spec.checkpoint_every or spec.train_steps,
        validate_every=spec.validate_every,
        log_every=1,
        is_distributed=spec.world_size > 1,
        devices=[-1] * spec.world_size,
        world_size=spec.world_size,
    )
    model = Lazy(Model, Params({"type": "tango_fairscale::causal_lm", "model": str(model_dir)}))
    params = engine_config(f"tango_fairscale::{spec.engine}", **spec.engine_params)
    engine = Lazy(TrainingEngine, Params(params))
    task = TaskSpec(name="piqa", dataset=dataset)
    pairs = training_pairs(load_tasks(task, training=True)["tasks"]["piqa"], "piqa")
    return TrainPlan(
        config,
        model,
        engine,
        pairs,
        [task] if spec.validate else [],
        batch_size=8,
        # The last step's checkpoint keeps its optimizer state: tests resume from it.
        runtime=TrainRuntime(
            eval_batch_size=32,
            pack_sequences=spec.pack_sequences,
            keep_optimizer_state=True,
            defer_checkpoints=False,  # exactly at the cadence: tests resume from those steps
        ),
        component_modules=component_modules(model, engine),
    )


class RunStore:
    """Trains the runs ``needed`` by the selected tests on the first request: the one-process
    runs here in a thread while the groups of other world sizes train in spawned processes (on
    2 cores, each alone keeps the machine about two-thirds busy)."""

    def __init__(self, needed: set[str], root: Path, model_dir: Any, dataset: Any) -> None:
        self.needed, self.root, self.model_dir, self.dataset = needed, root, model_dir, dataset
        self.results: dict[str, Any] = {}

    def get(self, name: str) -> Any:
        """The run's :class:`~helpers.group.TrainedRun`; the test fails if the run failed."""
        if name not in self.results:
            self._train(self.needed | {name})
        result = self.results[name]
        if isinstance(result, str):
            pytest.fail(result, pytrace=False)
        return result

    def _train(self, names: set[str]) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from helpers.group import train_many

        by_world_size: dict[int, dict[str, Any]] = {}
        for name in sorted(names - self.results.keys()):
            spec = SPECS[name]
            directory = self.root / name.replace("/", "--")
            plan = build_plan(spec, directory, self.model_dir(spec.model), self.dataset)
            by_world_size.setdefault(spec.world_size, {})[name] = plan
        one_process = by_world_size.pop(1, {})
        with ThreadPoolExecutor(1) as pool:  # spawning (signal handlers) stays in this thread
            here = pool.submit(train_many, one_process) if one_process else None
            for plans in by_world_size.values():
                self.results.update(train_many(plans))
            if here is not None:
                self.results.update(here.result())
