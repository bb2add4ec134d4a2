"""The training step's Tango callbacks (torch::train's hooks), early stopping, the learning-rate
schedule the log reports, and the throughput figures it logs — one process, the real loop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tango.common import Lazy, Params
from tango.integrations.torch import Model, StopEarly, TrainCallback, TrainConfig, TrainingEngine

from tango_fairscale.records.training_log import read_training_log
from tango_fairscale.runtime.process_group import free_port
from tango_fairscale.tasks.lm_eval import TaskSpec, load_tasks
from tango_fairscale.tasks.training_pairs import training_pairs
from tango_fairscale.train.launch import run_training
from tango_fairscale.train.loop import TrainPlan, TrainRuntime
from tango_fairscale.train.lr_schedule import WarmupSchedule

CALLS: list[tuple[str, Any]] = []


@TrainCallback.register("test::recording")
class Recording(TrainCallback):
    """Records every hook; stops the run at the ``stop_at``-th validation."""

    def __init__(self, *args: Any, stop_at: int = 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stop_at = stop_at
        self.validations = 0

    def pre_train_loop(self) -> None:
        CALLS.append(("pre_train_loop", None))

    def post_train_loop(self, step: int, epoch: int) -> None:
        CALLS.append(("post_train_loop", step))

    def pre_epoch(self, step: int, epoch: int) -> None:
        CALLS.append(("pre_epoch", (step, epoch)))

    def post_epoch(self, step: int, epoch: int) -> None:
        CALLS.append(("post_epoch", (step, epoch)))

    def pre_batch(self, step: int, epoch: int, batch: list) -> None:
        CALLS.append(("pre_batch", (step, len(batch), "input_ids" in batch[0])))

    def post_batch(self, step: int, epoch: int, batch_loss: float, batch_outputs: list) -> None:
        CALLS.append(("post_batch", (step, isinstance(batch_loss, float), len(batch_outputs))))

    def log_batch(self, step: int, epoch: int, batch_loss: float, batch_outputs: list) -> None:
        CALLS.append(("log_batch", (step, batch_loss)))

    def post_val_loop(self, step: int, epoch: int, val_metric: float, best: float) -> None:
        CALLS.append(("post_val_loop", (step, val_metric, best)))
        self.validations += 1
        if self.validations == self.stop_at:
            raise StopEarly


def run(
    work_dir: Path,
    model_dir: Path,
    dataset_dict: Any,
    train_steps: int,
    callbacks: list[dict],
    **engine_options: Any,
) -> list[dict]:
    """The real loop in one process (DDP), logging every step, validating every 2."""
    CALLS.clear()
    config = TrainConfig(
        "callbacks",
        work_dir,
        train_steps=train_steps,
        checkpoint_every=100,
        validate_every=2,
        log_every=1,
        devices=[-1],
        distributed_port=free_port(),
    )
    task = TaskSpec(name="piqa", dataset=dataset_dict, limit=16)
    engine = {
        "type": "tango_fairscale::ddp",
        "precision": "32-true",
        "optimizer": {"type": "torch::AdamW", "lr": 1e-3},
        **engine_options,
    }
    plan = TrainPlan(
        config,
        Lazy(Model, Params({"type": "tango_fairscale::causal_lm", "model": str(model_dir)})),
        Lazy(TrainingEngine, Params(engine)),
        training_pairs(load_tasks(task, training=True)["tasks"]["piqa"], "piqa"),
        [task],
        batch_size=8,
        runtime=TrainRuntime(eval_batch_size=32),
        callbacks=[Lazy(TrainCallback, Params(c)) for c in callbacks],
    )
    run_training(plan)
    return read_training_log(work_dir / "training_log.jsonl")


def test_callbacks_get_torch_train_hooks_and_stop_early(
    tmp_path: Path, tiny_model_dir: Path, piqa_small: Any
) -> None:
    log = run(tmp_path, tiny_model_dir, piqa_small, 8, [{"type": "test::recording", "stop_at": 2}])
    names = [name for name, _ in CALLS]
    assert names[0] == "pre_train_loop" and names[-1] == "post_train_loop"
    assert names[1] == "pre_epoch"
    # Stopped by the callback at its second validation (step 4 of 8), after a checkpoint.
    assert [args[0] for name, args in CALLS if name == "pre_batch"] == [0, 1, 2, 3]
    assert all(args[1:] == (1, True) for name, args in CALLS if name == "pre_batch")
    assert [args for name, args in CALLS if name == "post_batch"] == [
        (step, True, 1) for step in range(4)
    ]
    logged = {r["step"]: r for r in log if "train_loss" in r}
    assert [args[0] for name, args in CALLS if name == "log_batch"] == [0, 1, 2, 3]
    for step, loss in (args for name, args in CALLS if name == "log_batch"):
        assert loss == pytest.approx(logged[step + 1]["train_loss"])
    validations = [args for name, args in CALLS if name == "post_val_loop"]
    assert [step for step, _, _ in validations] == [1, 3]
    accuracies = [r["val_acc"] for r in log if "val_acc" in r]
    assert [value for _, value, _ in validations] == accuracies  # val_metric: piqa's acc
    assert validations[1][2] == max(accuracies)  # the best so far
    assert max(r["step"] for r in log) == 4
    assert (tmp_path / "final_weights.pt").is_file()
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step0000004"


def test_logged_learning_rate_is_the_one_each_step_used(
    tmp_path: Path, tiny_model_dir: Path, piqa_small: Any
) -> None:
    schedule = {
        "type": "tango_fairscale::warmup",
        "warmup_steps": 2,
        "train_steps": 6,
        "decay": "linear",
    }
    log = run(tmp_path, tiny_model_dir, piqa_small, 6, [], lr_scheduler=schedule)
    factors = WarmupSchedule(torch.optim.SGD([torch.zeros(1)], lr=1.0), 2, 6, "linear").factor
    lrs = [r["lr"] for r in log if "lr" in r]
    assert lrs == pytest.approx([1e-3 * factors(step) for step in range(6)])
    assert lrs[:3] == pytest.approx([1e-3 / 3, 2e-3 / 3, 1e-3])  # warmup, then decay
    for record in (r for r in log if "train_loss" in r):
        assert record["tokens_per_s"] > 0 and record["elapsed_s"] > 0
        assert "mfu" not in record  # no known peak on a CPU
    elapsed = [r["elapsed_s"] for r in log if "elapsed_s" in r]
    assert elapsed == sorted(elapsed)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"warmup_steps": -1}, "warmup_steps must be 0 or a positive integer"),
        ({"decay": "exponential"}, "unknown decay 'exponential'"),
        ({"warmup_steps": 6, "train_steps": 6, "decay": "linear"}, "leaves no steps to decay"),
    ],
)
def test_bad_schedules_are_one_line(options: dict, message: str) -> None:
    from tango.common.exceptions import ConfigurationError

    with pytest.raises(ConfigurationError, match=message):
        WarmupSchedule(torch.optim.SGD([torch.zeros(1)], lr=1.0), **options)
