"""Launching a training plan (``train/launch.py``), the parts that run in this process: the modules
a worker must import for the plan's components, the hint a worker's failure ends with, and one
device's run trained here, not in a spawned process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tango.common import Lazy, Params, Registrable
from tango.integrations.torch import Model, TrainCallback, TrainConfig, TrainingEngine

from tango_fairscale.model.loading import MODEL_CODE
from tango_fairscale.parallel.fsdp2 import FSDP2_CODE
from tango_fairscale.records.checkpoints import run_id
from tango_fairscale.runtime.spawn import WorkerFailed
from tango_fairscale.tasks.lm_eval import TaskSpec, load_tasks
from tango_fairscale.tasks.training_pairs import training_pairs
from tango_fairscale.train.launch import _hint, component_modules, run_training
from tango_fairscale.train.loop import TrainPlan


@TrainCallback.register("test::launch_callback")
class LaunchCallback(TrainCallback):
    """A callback registered by this test module: a worker must import it to build it."""


def make_plan(work_dir: Path, model_dir: Path | None = None, pairs: list | None = None, **options):
    """A one-device plan of the DDP engine (every ``TrainPlan`` of this file is made here;
    ``options``: its fields, and its runtime block's)."""
    from conftest import engine_config, with_runtime

    config = TrainConfig(
        "launch", work_dir, train_steps=2, checkpoint_every=2, devices=[-1], world_size=1
    )
    model = Lazy(Model, Params({"type": "tango_fairscale::causal_lm", "model": str(model_dir)}))
    engine = Lazy(TrainingEngine, Params(engine_config("tango_fairscale::ddp")))
    fields = with_runtime({"eval_batch_size": 8, **options})
    return TrainPlan(config, model, engine, pairs or [], [], 8, **fields)


def test_component_modules_are_those_registering_every_named_type() -> None:
    model = Lazy(Model, Params({"type": "tango_fairscale::causal_lm", "model": "unused"}))
    engine = Lazy(
        TrainingEngine,
        Params(
            {
                "type": "tango_fairscale::ddp",
                "optimizer": {"type": "torch::AdamW", "lr": 1e-3},
                "lr_scheduler": {"type": "tango_fairscale::warmup", "warmup_steps": 1},
            }
        ),
    )
    callbacks = [
        Lazy(TrainCallback, Params({"type": "test::launch_callback"})),
        Lazy(TrainCallback, Params({"type": "test::launch_callback"})),
    ]
    modules = component_modules(model, engine, *callbacks)
    assert len(modules) == len(set(modules))  # each once
    assert set(modules) == {
        "tango_fairscale.model.causal_lm",
        "tango_fairscale.parallel.ddp",
        "torch.optim.adamw",
        "tango_fairscale.train.lr_schedule",
        __name__,
        *MODEL_CODE,  # the model's transformers code, which it imports only when it loads one
    }


def test_the_fsdp2_engine_brings_the_torch_modules_it_imports_when_used() -> None:
    """FSDP2's and DCP's modules, which the engine's module imports only when it shards a model
    or touches a checkpoint: the fork server imports them once, not each worker."""
    engine = Lazy(
        TrainingEngine,
        Params({"type": "tango_fairscale::fsdp2", "optimizer": {"type": "torch::AdamW"}}),
    )
    modules = component_modules(engine)
    assert len(modules) == len(set(modules))
    assert set(modules) == {"tango_fairscale.parallel.fsdp2", "torch.optim.adamw", *FSDP2_CODE}
    assert {"torch.distributed.fsdp", "torch.distributed.checkpoint"} <= set(FSDP2_CODE)


def test_types_no_registry_knows_need_no_module() -> None:
    unknown = Lazy(Model, Params({"type": "nobody::knows", "nested": [{"type": 3}]}))
    assert component_modules(unknown) == ()
    assert "nobody::knows" not in {n for r in Registrable._registry.values() for n in r}


def test_a_dead_worker_hints_at_resuming_a_timeout_at_the_timeout(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, collective_timeout_s=90)
    died = WorkerFailed("worker 1 died (signal SIGKILL)")
    assert _hint(died, plan) == "; rerun the same command to resume from the start"
    plan.checkpoints.mkdir()
    (plan.checkpoints / "latest").write_text("step0000004\n")
    assert _hint(died, plan) == "; rerun the same command to resume from checkpoint step0000004"
    for message in (
        "gloo: Timed out waiting 90000ms",
        "Watchdog caught collective operation timeout",
    ):
        assert _hint(WorkerFailed(message), plan) == (
            "; a collective timed out after 90 s (collective_timeout_s): another process hung "
            "or stopped"
        )
    assert _hint(WorkerFailed("worker 0 raised ValueError: bad"), plan) == ""


def test_one_device_trains_here_and_returns_the_model(
    tmp_path: Path, tiny_model_dir: Path, piqa_small: Any
) -> None:
    from tango_fairscale.model.causal_lm import ModelWrapper

    task = load_tasks(TaskSpec(name="piqa", dataset=piqa_small), training=True)["tasks"]["piqa"]
    pairs = training_pairs(task, "piqa")[:16]
    plan = make_plan(tmp_path / "work", tiny_model_dir, pairs, final_weights_to_file=False)
    state = run_training(plan)
    initial = ModelWrapper(str(tiny_model_dir)).state_dict()
    assert state is not None and state.keys() == initial.keys()
    assert any(not torch.equal(state[key], initial[key]) for key in initial)  # trained
    # The run's id, made before the run, is the one its checkpoints carry.
    assert plan.run_id is not None and plan.run_id == run_id(plan.checkpoints)
    assert (plan.checkpoints / "latest").read_text().strip() == "step0000002"
    assert not (tmp_path / "work" / "final_weights.pt").exists()
