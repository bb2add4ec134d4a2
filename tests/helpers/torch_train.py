"""Tango's own ``torch::train`` step on our loop's data, for the tests that compare it with our
training step (``tests/parallel/test_torch_train.py``, ``tests/integration/parallel/
test_torch_train_runs.py``).

The two loops are made to run the same arithmetic: a batch sampler replays our loop's
:class:`BatchSchedule` on every rank, and a collator builds our loop's padded batches. What would
make them differ otherwise is designed out: no validation split, or validation at the last step
only (``torch::train`` returns the *best* checkpoint by validation loss), dropout off (it restores
no RNG state on resume), and Tango's own data order is not used (``DistributedSampler``
interleaves ranks; our schedule gives each rank a contiguous slice).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from conftest import assert_close_by_key, engine_config, training_queries
from tango.common import DatasetDict, Lazy, Params
from tango.integrations.torch import DataLoader, Model, TrainCallback, TrainingEngine
from tango.integrations.torch.train import TorchTrainStep
from tango.workspaces import LocalWorkspace

from tango_fairscale.data.batches import training_batch
from tango_fairscale.data.queries import Query
from tango_fairscale.data.schedules import BatchSchedule
from tango_fairscale.model.causal_lm import ModelWrapper
from tango_fairscale.runtime.process_group import free_port, leave_process_group

STEPS, BATCH, SEED = 4, 8, 42  # our loop's seed and (train_in's) global batch


class ScheduleSampler(torch.utils.data.Sampler):
    """This rank's micro-batch of our :class:`BatchSchedule`, step after step."""

    def __init__(self, num_examples: int, steps: int) -> None:
        self.num_examples, self.steps = num_examples, steps

    def __iter__(self) -> Iterator[list[int]]:
        rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
        schedule = BatchSchedule(self.num_examples, BATCH, SEED, world, rank)
        for step in range(self.steps):
            yield from schedule.micro_batches(step)

    def __len__(self) -> int:
        return self.steps


class QueryBatches:
    """Our loop's training batch (padded, or ``packed``) of a list of queries."""

    def __init__(self, pad_token_id: int, max_length: int, packed: bool = False) -> None:
        self.pad_token_id, self.max_length, self.packed = pad_token_id, max_length, packed

    def __call__(self, queries: list[Query]) -> dict[str, torch.Tensor]:
        return training_batch(queries, self.pad_token_id, self.max_length, self.packed)


def train_loader(dataset: list[Query], collate: QueryBatches) -> DataLoader:
    return DataLoader(
        dataset, collate_fn=collate, batch_sampler=ScheduleSampler(len(dataset), STEPS)
    )


def validation_loader(dataset: list[Query], collate: QueryBatches) -> DataLoader:
    """Every rank the same number of batches (DistributedSampler pads): sharded forwards agree."""
    sampler = torch.utils.data.DistributedSampler(dataset, shuffle=False)
    return DataLoader(dataset, collate_fn=collate, batch_size=4, sampler=sampler)


class CrashOnce(TrainCallback):
    """Fails the step after ``crash_after`` steps, on its first run only (on every rank), and
    records in ``resumed-at`` the step of the checkpoint a rerun resumes from."""

    def __init__(self, *args: Any, crash_after: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.crash_after, self.steps_done = crash_after, 0

    def post_batch(self, step: int, epoch: int, batch_loss: float, batch_outputs: Any) -> None:
        self.steps_done = step + 1
        crashed = self.work_dir / "crashed"
        if self.steps_done == self.crash_after and not crashed.exists():
            if dist.is_initialized():
                dist.barrier()  # every rank has seen that it has not crashed yet
            if self.is_local_main_process:
                crashed.touch()
            raise RuntimeError(f"deliberate crash after step {self.steps_done}")

    def state_dict(self) -> dict[str, Any]:
        return {"steps_done": self.steps_done}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.is_local_main_process:
            (self.work_dir / "resumed-at").write_text(str(state_dict["steps_done"]))


def our_queries(model: ModelWrapper, examples: list[dict[str, Any]]) -> list[Query]:
    """The queries our loop trains on (``train_in``: lm-eval's ``piqa``, each correct choice)."""
    return training_queries(examples, model.tokenizer, model.max_length)


def torch_train(
    workspace: Path,
    model_dir: Path,
    data,
    engine: str,
    device_count: int,
    *,
    validate: bool = False,
    crash_after: int | None = None,
    packed: bool = False,
    engine_params: dict[str, Any] | None = None,
    **step_options: Any,
) -> tuple[ModelWrapper, Path]:
    """Tango's ``torch::train`` on our loop's data order; its result and work dir. With
    ``crash_after``, the first run fails after that step and a second one resumes."""
    model = ModelWrapper(str(model_dir))
    collate = QueryBatches(model.pad_token_id, model.max_length, packed)
    splits = {"train": our_queries(model, list(data["train"]))}
    if validate:
        splits["validation"] = our_queries(model, list(data["validation"]))
    callbacks = [Lazy(CrashOnce, Params({"crash_after": crash_after}))] if crash_after else []
    step = TorchTrainStep(
        model=Lazy(Model, Params({"type": "tango_fairscale::causal_lm", "model": str(model_dir)})),
        training_engine=Lazy(
            TrainingEngine, Params(engine_config(engine, **(engine_params or {})))
        ),
        dataset_dict=DatasetDict(splits),
        train_dataloader=Lazy(functools.partial(train_loader, collate=collate)),
        validation_dataloader=Lazy(functools.partial(validation_loader, collate=collate)),
        validation_split="validation" if validate else None,
        validate_every=STEPS if validate else None,  # at the end only: the best is the last
        train_steps=STEPS,
        checkpoint_every=2,
        log_every=1,
        device_count=device_count,
        distributed_port=free_port(),
        callbacks=callbacks,
        **step_options,
    )
    local = LocalWorkspace(workspace)
    try:
        if crash_after:
            with pytest.raises(Exception, match="deliberate crash"):
                step.result(local)
        result = step.result(local)
    finally:
        leave_process_group()  # a one-process sharded engine joined a group in this process
    return result, local.work_dir(step)


def assert_bitwise_same_weights(result: ModelWrapper, work_dir: Path, reference: dict) -> None:
    assert type(result) is ModelWrapper  # not the engine's FSDP / FSDP2 / Pipe wrapper
    state = result.state_dict()
    assert state.keys() == reference.keys()
    assert torch.load(work_dir / "weights.pt", weights_only=True).keys() == reference.keys()
    # Bitwise: the same batches through the same engine code (measured: 0.0 for every engine at
    # 1 process, and for fairscale at 2 across a crash and resume).
    assert_close_by_key(state, reference)


PIPE_ON_TWO = "the pipe engine drives all its stages from one process; set device_count=1 (got 2)"
