"""Tango's own ``torch::train`` step driving our engines on 2 processes, across a crash and resume,
ends with the weights of our training step's 2-process run (a parity run,
``tests/helpers/parity.py``); ``examples/torch_train_fairscale.jsonnet`` runs with ``tango run``
as its header says, and refuses ``pipe`` on two processes in one line. The one-process
comparisons and the refusals when the step is built are ``tests/parallel/test_torch_train.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO_ROOT
from helpers.parity import RunSpec, define, run_param
from helpers.torch_train import PIPE_ON_TWO, STEPS, assert_bitwise_same_weights, torch_train


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
