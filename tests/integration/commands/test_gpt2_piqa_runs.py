"""End to end through the real CLI: ``tango run configs/gpt2_piqa.jsonnet -w WS -D ...``.

Every run is a subprocess started from the repository root, where ``tango.yml`` supplies the
defaults of the config's external variables. The runs are independent: those of the selected
tests start together when the module's first test asks for them, each test waits for its own,
and the lm-eval reference of the evaluation test is computed in this process meanwhile. Every
process uses one intra-op thread (as ``torchrun`` sets), so concurrent runs do not oversubscribe
the CPU.

* evaluation only (``train_steps=0``) of a tiny seeded GPT-2 on all 1,838 PIQA validation
  examples equals lm-evaluation-harness's own ``piqa`` task with its HF backend, per example;
* 10 steps of 2-process DDP training on CPU (gloo) lower the loss and validate at steps 5 and
  10; the identical command again reuses every cached step;
* unknown engine, planned-but-missing engine and unknown model path fail with one clear line.

The evaluation and the training runs are in the slow tier; the one-line errors in the default one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[3]
CONFIG = "configs/gpt2_piqa.jsonnet"
NUM_VALIDATION = 1838
STEPS = ("piqa", "trained_model", "requests", "predictions", "metrics")
TRAIN_STEPS, VALIDATE_EVERY = 10, 5
TRAIN_DEFINES = (
    f"train_steps={TRAIN_STEPS}",
    "device_count=2",
    "engine=ddp",
    "limit=64",
    "batch_size=8",
    f"validate_every={VALIDATE_EVERY}",
    "lr=1e-3",
)
RUN_TIMEOUT_S = 600
RUN_OF_TEST = {
    "test_unknown_engine_is_one_line": "bogus_engine",
    "test_pipe_on_two_processes_is_one_line": "pipe_two_devices",
    "test_unknown_model_path_is_one_line": "no_model",
    "test_evaluation_equals_lm_eval_piqa": "evaluate",
    "test_ddp_training_lowers_loss_and_validates": "train",
    "test_identical_rerun_reuses_every_cached_step": "train",
}


@dataclass
class TangoRun:
    """One ``tango run`` subprocess, its combined output in ``log`` (with ``stderr``, its stderr
    alone in ``stderr``: for counting what the terminal shows)."""

    name: str
    workspace: Path
    defines: tuple[str, ...]
    log: Path
    stderr: Path | None = None
    process: subprocess.Popen = field(init=False)
    started: float = field(init=False)
    seconds: float | None = None

    def start(self) -> TangoRun:
        command = [sys.executable, "-m", "tango", "run", CONFIG, "-w", str(self.workspace)]
        command += ["-n", self.name]
        for define in self.defines:
            command += ["-D", define]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.started = time.time()
        with self.log.open("w") as out, open(self.stderr or os.devnull, "w") as err:
            self.process = subprocess.Popen(
                command,
                cwd=REPO_ROOT,
                stdout=out,
                stderr=err if self.stderr else subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        return self

    def wait(self) -> tuple[int, str]:
        if not hasattr(self, "process"):
            self.start()
        returncode = self.process.wait(timeout=RUN_TIMEOUT_S)
        if self.seconds is None:  # until the last output, not until this wait
            self.seconds = self.log.stat().st_mtime - self.started
        err = self.stderr.read_text(errors="replace") if self.stderr else ""
        return returncode, self.log.read_text(errors="replace") + err

    def succeeded(self) -> str:
        returncode, output = self.wait()
        assert returncode == 0, f"tango run {self.name} failed:\n{output[-6000:]}"
        return output

    def stop(self) -> None:
        if self.process.poll() is None:  # kill this run's own process group (it spawns workers)
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@pytest.fixture(scope="module")
def wide_model_dir(tmp_path_factory: pytest.TempPathFactory, gpt2_tokenizer_dir: Path) -> Path:
    """The tiny GPT-2 with GPT-2's own tokenizer (the headline comparison with lm-eval) and 256
    positions: lm-eval's HF backend refuses a continuation longer than the window, and PIQA's
    longest is 246 tokens (contexts are still left-truncated). 8 wide: the projection onto
    GPT-2's 50,257 tokens is most of the scoring's time, lm-eval's and ours; the log-likelihoods
    are as large as a wider model's (|ll| up to 2,660 on PIQA)."""
    from conftest import save_tiny_gpt2

    directory = tmp_path_factory.mktemp("wide-gpt2")
    return save_tiny_gpt2(directory, gpt2_tokenizer_dir, n_positions=256, n_embd=8)


@pytest.fixture(scope="module")
def runs(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    tiny_model_dir: Path,
    wide_model_dir: Path,
    piqa_dir: Path,
) -> Iterator[dict[str, TangoRun]]:
    root = tmp_path_factory.mktemp("tango-runs")
    model, data = f"model={tiny_model_dir}", f"data_dir={piqa_dir}"

    def run(
        name: str, *defines: str, workspace: str | None = None, stderr: bool = False
    ) -> TangoRun:
        err = root / f"{name}.stderr" if stderr else None
        return TangoRun(name, root / (workspace or name), defines, root / f"{name}.log", err)

    started = {
        "evaluate": run("evaluate", f"model={wide_model_dir}", data, "train_steps=0"),
        "train": run("train", model, data, *TRAIN_DEFINES, workspace="train-ws"),
        "bogus_engine": run("bogus_engine", model, data, "engine=bogus", "train_steps=5"),
        "no_model": run("no_model", "model=/nonexistent/dir", data, "train_steps=0", stderr=True),
    }
    started["pipe_two_devices"] = run(
        "pipe_two_devices", model, data, "engine=pipe", "device_count=2", "train_steps=5"
    )
    # Start together the runs that the selected tests of this module wait for; any other run
    # starts when first waited for.
    module = sys.modules[__name__]
    selected = {
        item.name for item in request.session.items if getattr(item, "module", None) is module
    }
    for test, run_name in RUN_OF_TEST.items():
        if test in selected and run_name in started and not hasattr(started[run_name], "process"):
            started[run_name].start()
    started["train_again"] = run("train_again", model, data, *TRAIN_DEFINES, workspace="train-ws")
    yield started
    timings = {name: r.seconds for name, r in started.items() if r.seconds is not None}
    print("\ntango run seconds:", {name: round(t, 1) for name, t in timings.items()})
    for tango_run in started.values():
        if hasattr(tango_run, "process"):
            tango_run.stop()


def result(tango_run: TangoRun, step: str) -> Any:
    from tango import Workspace

    return Workspace.from_url(str(tango_run.workspace)).step_result_for_run(tango_run.name, step)


# c. One-line errors -----------------------------------------------------------------------------


def assert_fails_with_line(tango_run: TangoRun, message: str) -> str:
    returncode, output = tango_run.wait()
    assert returncode != 0, output[-3000:]
    lines = [line for line in output.splitlines() if message in line]
    assert lines, f"no line of the output holds {message!r}:\n{output[-3000:]}"
    return lines[0]


def test_unknown_engine_is_one_line(runs: dict[str, TangoRun]) -> None:
    line = assert_fails_with_line(runs["bogus_engine"], "unknown engine 'bogus'; choose one of ")
    assert all(name in line for name in ("ddp", "fairscale", "fsdp2", "pipe")), line
    assert "Starting step" not in runs["bogus_engine"].log.read_text()


def test_pipe_on_two_processes_is_one_line(runs: dict[str, TangoRun]) -> None:
    assert_fails_with_line(
        runs["pipe_two_devices"],
        "engine 'pipe' drives all its devices from one process: set -D device_count=1",
    )
    assert "Starting step" not in runs["pipe_two_devices"].log.read_text()


def test_unknown_model_path_is_one_line(runs: dict[str, TangoRun]) -> None:
    line = assert_fails_with_line(
        runs["no_model"], "cannot load model from path '/nonexistent/dir' (no such directory)"
    )
    assert " ERROR    cannot load model" in line  # the message alone (tests/test_terminal_errors)
    # What the terminal shows: nothing on stdout, that one line on stderr.
    assert runs["no_model"].log.read_text() == ""
    assert runs["no_model"].stderr is not None
    assert runs["no_model"].stderr.read_text().splitlines() == [line]
    assert "Traceback" not in line


# a. Evaluation equals lm-eval's piqa -------------------------------------------------------------


def lm_eval_piqa(model_dir: Path, piqa_dir: Path, tmp_path: Path) -> dict[str, Any]:
    """lm-evaluation-harness itself: its ``piqa`` task and HF backend (fp32, CPU) over the
    official validation files, written in the hub dataset's schema (``goal``, ``sol1``,
    ``sol2``, ``label``)."""
    import lm_eval
    from conftest import lm_eval_as_released
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._yaml_loader import load_yaml

    lines = (piqa_dir / "valid.jsonl").read_text(encoding="utf-8").splitlines()
    golds = [int(label) for label in (piqa_dir / "valid-labels.lst").read_text().split()]
    rows = [{**json.loads(line), "label": gold} for line, gold in zip(lines, golds, strict=True)]
    validation = tmp_path / "validation.jsonl"
    validation.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    config = load_yaml(
        Path(lm_eval.tasks.__file__).parent / "piqa" / "piqa.yaml", resolve_func=True
    )
    config.update(
        dataset_path="json",
        dataset_name=None,
        dataset_kwargs={"data_files": {"validation": str(validation)}},
        training_split=None,
    )
    # logits_cache=False: the true log-likelihoods (see tests/evaluation/test_lm_eval_exact.py).
    with lm_eval_as_released():
        return lm_eval.simple_evaluate(
            model="hf",
            model_args=f"pretrained={model_dir},dtype=float32,logits_cache=False",
            tasks=[config],
            task_manager=TaskManager(include_defaults=False),
            device="cpu",
            batch_size=1,  # no padding; on the CPU also the fastest (half the time of 32)
            log_samples=True,
        )


@pytest.mark.slow
def test_evaluation_equals_lm_eval_piqa(
    runs: dict[str, TangoRun], wide_model_dir: Path, piqa_dir: Path, tmp_path: Path
) -> None:
    """``train_steps=0`` on all 1,838 official validation examples: the same requests, scores
    within 1e-4 (plus lm-eval's own float32 rounding) and the same predictions and metrics as
    lm-eval's own ``piqa`` with its HF backend — so the official files' reader and the lm-eval
    task path agree with it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tango runs use the other core(s) meanwhile
    try:
        reference = lm_eval_piqa(wide_model_dir, piqa_dir, tmp_path)
    finally:
        torch.set_num_threads(threads)
    expected = {sample["doc_id"]: sample for sample in reference["samples"]["piqa"]}
    assert len(expected) == NUM_VALIDATION

    output = runs["evaluate"].succeeded()
    assert "trained_model" not in output  # train_steps=0: no training step
    metrics = result(runs["evaluate"], "metrics")
    assert metrics["num_examples"] == NUM_VALIDATION
    samples = result(runs["evaluate"], "predictions")["samples"]["piqa"]
    assert len(samples) == NUM_VALIDATION
    got, want = [], []
    for sample in samples:
        reference_sample = expected[sample["doc_id"]]
        assert sample["arguments"] == [list(a) for a in reference_sample["arguments"]]
        assert (sample["acc"], sample["acc_norm"]) == (
            reference_sample["acc"],
            reference_sample["acc_norm"],
        )
        got += [resp[0][0] for resp in sample["resps"]]
        want += [resp[0][0] for resp in reference_sample["resps"]]
    # Within 1e-4 plus two float32 steps of |ll| (2.4e-7 relative): ours are float64 sums of the
    # per-token log-probabilities, lm-eval's float32 ones, off their exact sum by up to about that
    # (tests/evaluation/test_lm_eval_exact.py). Measured: |ll| up to 2,660, at worst 1.9e-4 apart
    # (at -2,490), 14 of 3,676 beyond 1e-4.
    worst = float(np.abs(np.array(got) - np.array(want)).max())
    assert np.allclose(got, want, rtol=2.4e-7, atol=1e-4), f"max |Δ loglikelihood| = {worst}"
    for metric in ("acc", "acc_norm", "acc_stderr", "acc_norm_stderr"):
        assert metrics[metric] == pytest.approx(reference["results"]["piqa"][f"{metric},none"])


# b. Training on CPU with 2 processes, then the cached rerun -------------------------------------


@pytest.mark.slow
def test_ddp_training_lowers_loss_and_validates(runs: dict[str, TangoRun]) -> None:
    output = runs["train"].succeeded()
    for step in STEPS:
        assert f'Starting step "{step}"' in output
    model = result(runs["train"], "trained_model")
    log = model.training_log
    losses = [record["train_loss"] for record in log if "train_loss" in record]
    assert len(losses) >= 2 and losses[-1] < losses[0], log
    validation = {r["step"]: r for r in log if "val_acc" in r}
    assert sorted(validation) == [VALIDATE_EVERY, TRAIN_STEPS], log
    for record in validation.values():
        assert 0.0 <= record["val_acc"] <= 1.0 and 0.0 <= record["val_acc_norm"] <= 1.0
        assert record["val_num_examples"] == 64
    # The same log is stored next to the weights in the step's result directory.
    from tango import Workspace

    workspace = Workspace.from_url(str(runs["train"].workspace))
    directory = workspace.registered_run(runs["train"].name).steps["trained_model"].result_location
    assert directory is not None
    stored = (Path(directory) / "training_log.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in stored] == log
    metrics = result(runs["train"], "metrics")
    assert metrics["num_examples"] == 64


@pytest.mark.slow
def test_identical_rerun_reuses_every_cached_step(runs: dict[str, TangoRun]) -> None:
    first = runs["train"]
    first.succeeded()
    from tango import Workspace

    workspace = Workspace.from_url(str(first.workspace))
    before = {
        name: info.unique_id for name, info in workspace.registered_run(first.name).steps.items()
    }
    assert sorted(before) == sorted(STEPS)
    cache = first.workspace / "cache"
    files = [path for path in cache.rglob("*") if path.is_file() and path.name != "lock"]
    mtimes = {path: path.stat().st_mtime_ns for path in files}  # lock files are touched

    again = runs["train_again"].start()
    output = again.succeeded()
    assert "Starting step" not in output, output[-3000:]
    for step in STEPS:
        assert f'Found output for step "{step}" in cache' in output
    after = Workspace.from_url(str(again.workspace)).registered_run(again.name).steps
    assert {name: info.unique_id for name, info in after.items()} == before
    assert {p: p.stat().st_mtime_ns for p in mtimes} == mtimes  # nothing rewritten
    assert again.seconds is not None and again.seconds < 60
