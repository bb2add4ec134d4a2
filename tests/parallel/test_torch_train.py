"""Tango's own ``torch::train`` step driving our engines: the same weights as our training step on
the same data, checkpoints it resumes from, a plain ``ModelWrapper`` as its result, and a one-line
refusal of what only ``tango_fairscale::train`` does (``pipe`` on two processes: when the step is
built, before any worker).

The two loops are made to run the same arithmetic: a batch sampler replays our loop's
:class:`BatchSchedule` on every rank, and a collator builds our loop's padded batches. What would
make them differ otherwise is designed out: no validation split, or validation at the last step
only (``torch::train`` returns the *best* checkpoint by validation loss), dropout off (it restores
no RNG state on resume), and Tango's own data order is not used (``DistributedSampler``
interleaves ranks; our schedule gives each rank a contiguous slice).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from conftest import REPO_ROOT, assert_close_by_key, engine_config, train_in, training_queries
from helpers.parity import RunSpec, define, run_param
from tango.common import DatasetDict, Lazy, Params
from tango.common.exceptions import ConfigurationError
from tango.integrations.torch import DataLoader, Model, TrainCallback, TrainingEngine
from tango.integrations.torch.train import TorchTrainStep
from tango.workspaces import LocalWorkspace

from tango_fairscale.data.batches import training_batch
from tango_fairscale.data.queries import Query
from tango_fairscale.data.schedules import BatchSchedule
from tango_fairscale.model.causal_lm import ModelWrapper
from tango_fairscale.runtime.process_group import free_port, leave_process_group
from tango_fairscale.train.loop import FINAL_WEIGHTS

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


@pytest.fixture(scope="module")
def ours(tmp_path_factory, tiny_model_dir: Path, piqa_small):
    """``ours(engine, device_count)``: our training step's final weights (made once per module)."""
    runs: dict[tuple[str, int], dict[str, torch.Tensor]] = {}

    def run(engine: str, device_count: int) -> dict[str, torch.Tensor]:
        if (engine, device_count) not in runs:
            work_dir = tmp_path_factory.mktemp(f"ours-{engine.split('::')[1]}-{device_count}")
            train_in(work_dir, tiny_model_dir, piqa_small, engine, device_count, STEPS)
            runs[engine, device_count] = torch.load(work_dir / FINAL_WEIGHTS, weights_only=True)
        return runs[engine, device_count]

    return run


def assert_bitwise_same_weights(result: ModelWrapper, work_dir: Path, reference: dict) -> None:
    assert type(result) is ModelWrapper  # not the engine's FSDP / FSDP2 / Pipe wrapper
    state = result.state_dict()
    assert state.keys() == reference.keys()
    assert torch.load(work_dir / "weights.pt", weights_only=True).keys() == reference.keys()
    # Bitwise: the same batches through the same engine code (measured: 0.0 for every engine at
    # 1 process, and for fairscale at 2 across a crash and resume).
    assert_close_by_key(state, reference)


#: One engine in the default tier, the others in the slow one.
ENGINES = [
    pytest.param(
        f"tango_fairscale::{name}", id=name, marks=[] if name == "fairscale" else [pytest.mark.slow]
    )
    for name in ("ddp", "fairscale", "fsdp2", "pipe")
]


@pytest.mark.parametrize("engine", ENGINES)
def test_one_process_matches_our_step(
    engine: str, ours, tmp_path: Path, tiny_model_dir: Path, piqa_small
) -> None:
    result, work_dir = torch_train(tmp_path, tiny_model_dir, piqa_small, engine, 1)
    assert_bitwise_same_weights(result, work_dir, ours(engine, 1))
    untrained = ModelWrapper(str(tiny_model_dir)).state_dict()  # the comparison can fail
    assert any(
        not torch.allclose(untrained[k], v, atol=1e-4) for k, v in result.state_dict().items()
    )


def test_resumes_its_own_checkpoint(ours, tmp_path: Path, tiny_model_dir: Path, piqa_small) -> None:
    engine = "tango_fairscale::fairscale"
    result, work_dir = torch_train(
        tmp_path, tiny_model_dir, piqa_small, engine, 1, validate=True, crash_after=3
    )
    assert (work_dir / "resumed-at").read_text() == "2"  # the checkpoint of step 2, not the start
    assert_bitwise_same_weights(result, work_dir, ours(engine, 1))


def test_refuses_accuracy_validation(tmp_path: Path, tiny_model_dir: Path, piqa_small) -> None:
    with pytest.raises(ConfigurationError) as error:
        torch_train(
            tmp_path, tiny_model_dir, piqa_small, "tango_fairscale::fairscale", 1,
            validate=True, val_metric_name="acc", minimize_val_metric=False,
        )  # fmt: skip
    message = str(error.value)
    assert "\n" not in message and "use the tango_fairscale::train step" in message


def test_refuses_packed_batches_the_engine_cannot_take(
    tmp_path: Path, tiny_model_dir: Path, piqa_small
) -> None:
    with pytest.raises(ConfigurationError) as error:
        torch_train(
            tmp_path, tiny_model_dir, piqa_small, "tango_fairscale::pipe", 1,
            packed=True, engine_params={"chunks": 1},
        )  # fmt: skip
    message = str(error.value)
    assert "\n" not in message and "cannot take packed batches" in message


PIPE_ON_TWO = "the pipe engine drives all its stages from one process; set device_count=1 (got 2)"


def test_refuses_pipe_on_two_processes_when_the_step_is_built() -> None:
    """Before any worker starts (each of them refused it: 61 lines of output)."""
    engine = Lazy(TrainingEngine, Params(engine_config("tango_fairscale::pipe")))
    with pytest.raises(ConfigurationError) as error:
        TorchTrainStep(training_engine=engine, device_count=2)
    assert str(error.value).startswith(PIPE_ON_TWO) and "\n" not in str(error.value)
    TorchTrainStep(training_engine=engine, device_count=1)  # what the README says works


@pytest.mark.slow
def test_the_example_config_refuses_pipe_on_two_processes_in_one_line(
    tmp_path: Path, tiny_model_dir: Path, piqa_dir: Path
) -> None:
    variables = {
        "model": tiny_model_dir, "data_dir": piqa_dir, "engine": "pipe", "device_count": 2,
        "batch_size": 8, "train_steps": 4,
    }  # fmt: skip
    command = [sys.executable, "-m", "tango", "run", "examples/torch_train_fairscale.jsonnet"]
    command += ["-i", "tango_fairscale", "-i", "examples/torch_train_piqa.py"]
    command += ["-w", str(tmp_path / "ws")]
    command += [option for name, value in variables.items() for option in ("-D", f"{name}={value}")]
    run = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True)
    assert run.returncode == 1 and run.stdout == ""
    [line] = run.stderr.splitlines()
    assert PIPE_ON_TWO in line
    assert not (tmp_path / "ws").exists()  # refused before the workspace, let alone a worker


#: Our loop's 2-process runs of ``STEPS`` steps, the references of the resumed ``torch::train``
#: runs: trained with the other parity runs of 2 processes (one process group), not in a group of
#: their own. Validation and checkpoints change no weight.
TWO_PROCESS_RUNS = {
    engine: define(f"{engine}/{STEPS}-steps", RunSpec(engine, 2, train_steps=STEPS))
    for engine in ("fairscale", "fsdp2")
}


@pytest.mark.parametrize(
    "engine",
    [
        run_param(f"tango_fairscale::{engine}", name, id=engine, slow=True)
        for engine, name in TWO_PROCESS_RUNS.items()
    ],
)
def test_two_processes_match_our_step_across_a_resume(
    engine: str, trained_run, tmp_path: Path, tiny_model_dir: Path, piqa_small, monkeypatch
) -> None:
    from tango.common.logging import initialize_logging, teardown_logging

    # Both steps' spawned workers (2 on 2 cores) with one intra-op thread each, as torchrun sets
    # it: a bitwise comparison needs the same CPU kernels' partitioning in every process.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")

    initialize_logging(log_level="warning")  # torch::train's spawned workers log through it
    try:
        result, work_dir = torch_train(
            tmp_path, tiny_model_dir, piqa_small, engine, 2, validate=True, crash_after=3
        )
    finally:
        teardown_logging()
    assert (work_dir / "resumed-at").read_text() == "2"
    reference = trained_run(TWO_PROCESS_RUNS[engine.split("::")[1]]).state_dict()
    assert_bitwise_same_weights(result, work_dir, reference)


@pytest.mark.slow
def test_the_example_config_runs_with_tango_run(
    tmp_path: Path, tiny_model_dir: Path, piqa_dir: Path, capsys
) -> None:
    """``examples/torch_train_fairscale.jsonnet`` as its header says to run it (one process, a
    tiny model); the same command again starts no step; its stored result and an export of its
    checkpoint load with every key."""
    from transformers import AutoModelForCausalLM

    from tango_fairscale.cli import main

    variables = {
        "model": tiny_model_dir, "data_dir": piqa_dir, "limit": 32, "train_steps": 4,
        "batch_size": 8, "engine": "fairscale", "device_count": 1, "precision": "32-true",
        "lr": "1e-3", "seed": 42,
    }  # fmt: skip
    command = [sys.executable, "-m", "tango", "run", "examples/torch_train_fairscale.jsonnet"]
    command += ["-i", "tango_fairscale", "-i", "examples/torch_train_piqa.py"]
    command += ["-w", str(tmp_path / "ws")]
    command += [option for name, value in variables.items() for option in ("-D", f"{name}={value}")]
    run = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    # The same command again (another hash seed) finds every step in the cache.
    env = {**os.environ, "PYTHONHASHSEED": "123"}
    rerun = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, env=env)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "Starting step" not in rerun.stdout + rerun.stderr
    assert "Found output" in rerun.stdout + rerun.stderr
    [stored] = (tmp_path / "ws" / "cache").glob("TorchTrainStep-*")
    loaded = {}
    for name, directory in (("stored", stored), ("exported", tmp_path / "exported")):
        if name == "exported":
            assert main(["export", str(stored / "work"), str(directory)]) == 0
        model, info = AutoModelForCausalLM.from_pretrained(directory, output_loading_info=True)
        assert not any(info.values()), (name, info)
        loaded[name] = model.state_dict()
    weights = torch.load(stored / "work" / "weights.pt", weights_only=True)
    for key, value in weights.items():
        for state in loaded.values():
            torch.testing.assert_close(state[key.removeprefix("model.")], value, rtol=0, atol=0)
