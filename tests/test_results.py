"""Tests for run inspection (``tango_fairscale.results``) on a real workspace.

``piqa_workspace`` runs ``tango run configs/gpt2_piqa.jsonnet`` three times into one workspace,
once per test session: ``trained`` (4 DDP steps on a tiny GPT-2, validating every 2 steps),
``zeroshot`` (``train_steps=0``) and ``broken`` (a model directory that does not exist, so its
``trained_model`` step fails).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tango import Workspace

from tango_fairscale.results import (
    ResultsError,
    collect_runs,
    format_table,
    open_workspace,
    plot_curves,
    training_curves,
    training_log_path,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
TRAIN_STEPS = 4
LIMIT = 16


def _tango_run(workspace: Path, name: str, *, fails: bool = False, **overrides: object) -> None:
    command = [
        sys.executable,
        "-m",
        "tango",
        "run",
        "configs/gpt2_piqa.jsonnet",
        "-w",
        str(workspace),
        "-n",
        name,
    ]
    for key, value in {"limit": LIMIT, "engine": "ddp", **overrides}.items():
        command += ["-D", f"{key}={value}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    if (done.returncode != 0) != fails:
        raise RuntimeError(
            f"tango run {name} exited with {done.returncode}:\n{done.stdout[-3000:]}\n"
            f"{done.stderr[-3000:]}"
        )


def build_workspace(base: Path, model_dir: Path, piqa_dir: Path) -> Path:
    """The three runs in ``base/workspace``, built once (a marker file records completion)."""
    workspace = base / "workspace"
    marker = base / "workspace.done"
    if marker.is_file():
        return workspace
    _tango_run(
        workspace,
        "trained",
        model=model_dir,
        data_dir=piqa_dir,
        train_steps=TRAIN_STEPS,
        batch_size=4,
        validate_every=2,
        lr=1e-3,
    )
    _tango_run(workspace, "zeroshot", model=model_dir, data_dir=piqa_dir, train_steps=0)
    # Tango records the failure of trained_model in the workspace and exits non-zero.
    _tango_run(
        workspace,
        "broken",
        fails=True,
        model=base / "no-such-model",
        data_dir=piqa_dir,
        train_steps=1,
    )
    marker.touch()
    return workspace


@pytest.fixture(scope="session")
def piqa_workspace(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, piqa_dir: Path
) -> Path:
    return build_workspace(tmp_path_factory.getbasetemp(), tiny_model_dir, piqa_dir)


def test_collect_runs_reads_configuration_status_and_metrics(
    piqa_workspace: Path, tiny_model_dir: Path
) -> None:
    workspace = Workspace.from_url(str(piqa_workspace))
    summaries = {s.name: s for s in collect_runs(piqa_workspace)}
    assert list(summaries) == ["trained", "zeroshot", "broken"]  # oldest first

    trained, zeroshot, broken = summaries["trained"], summaries["zeroshot"], summaries["broken"]
    for summary in (trained, zeroshot):
        assert summary.status == "completed"
        assert summary.metrics == workspace.step_result_for_run(summary.name, "metrics")
        assert summary.num_examples == LIMIT
        assert summary.model == str(tiny_model_dir)
    assert trained.acc == trained.metrics["acc"] and trained.acc_norm == trained.metrics["acc_norm"]
    assert (trained.engine, trained.precision, trained.device_count, trained.train_steps) == (
        "ddp",
        "auto",
        1,
        TRAIN_STEPS,
    )
    assert trained.training_log is not None and Path(trained.training_log).is_file()
    assert (zeroshot.engine, zeroshot.precision, zeroshot.device_count) == (None, None, None)
    assert zeroshot.train_steps == 0 and zeroshot.training_log is None

    assert broken.status == "failed: trained_model"
    assert broken.metrics is None and broken.acc is None
    assert broken.error is not None and broken.error.startswith("trained_model: ")
    assert "no-such-model" in broken.error
    assert broken.train_steps == 1


def test_collect_runs_selects_runs_in_the_given_order(piqa_workspace: Path) -> None:
    names = [s.name for s in collect_runs(piqa_workspace, ["zeroshot", "trained", "zeroshot"])]
    assert names == ["zeroshot", "trained"]
    with pytest.raises(ResultsError, match="no run named 'nope'.*broken, trained, zeroshot"):
        collect_runs(piqa_workspace, ["nope"])


def test_workspace_urls_and_missing_workspaces(piqa_workspace: Path, tmp_path: Path) -> None:
    assert open_workspace(f"local://{piqa_workspace}").url == open_workspace(piqa_workspace).url
    missing = tmp_path / "missing"
    with pytest.raises(ResultsError, match="no Tango workspace"):
        collect_runs(missing)
    assert not missing.exists()  # never created as a side effect
    with pytest.raises(ResultsError, match="unknown workspace type 'nosuch'"):
        open_workspace("nosuch://somewhere")
    Workspace.from_url(str(tmp_path / "empty"))
    with pytest.raises(ResultsError, match="has no registered runs"):
        collect_runs(tmp_path / "empty")


def test_format_table_aligns_one_row_per_run(piqa_workspace: Path) -> None:
    summaries = collect_runs(piqa_workspace)
    lines = format_table(summaries).splitlines()
    assert len(lines) == 2 + len(summaries)
    assert lines[0].split()[:3] == ["run", "status", "model"]
    for column in ("engine", "precision", "devices", "train steps", "acc", "acc_norm", "examples"):
        assert column in lines[0]
    rows = {line.split()[0]: line for line in lines[2:]}
    trained = next(s for s in summaries if s.name == "trained")
    assert f"{trained.acc:.4f} ± {trained.metrics['acc_stderr']:.4f}" in rows["trained"]
    assert f"{trained.acc_norm:.4f}" in rows["trained"]
    assert rows["trained"].endswith(str(LIMIT))
    assert " ddp " in rows["trained"] and " auto " in rows["trained"]
    assert "failed: trained_model" in rows["broken"]
    assert rows["broken"].rstrip().endswith("-")
    # Right-aligned numbers end in the same column.
    assert len({len(line) for line in (rows["trained"], rows["zeroshot"])}) == 1


def test_training_curves_hold_the_logged_steps(piqa_workspace: Path) -> None:
    curves = training_curves(piqa_workspace, "trained")
    # train_loss after step 1 and the last step; validation every 2 steps and after the last.
    assert [r["step"] for r in curves] == [1, 2, 4]
    assert [r["step"] for r in curves if "train_loss" in r] == [1, 4]
    assert [r["step"] for r in curves if "val_acc" in r] == [2, 4]
    assert all(r["val_num_examples"] == LIMIT for r in curves if "val_acc" in r)
    # The last in-training validation and the metrics step score the same model on the same split.
    metrics = Workspace.from_url(str(piqa_workspace)).step_result_for_run("trained", "metrics")
    assert curves[-1]["val_acc"] == pytest.approx(metrics["acc"])
    assert curves[-1]["val_acc_norm"] == pytest.approx(metrics["acc_norm"])

    path = training_log_path(piqa_workspace, "trained")
    assert path is not None and path.name == "training_log.jsonl"
    assert training_curves(piqa_workspace, "zeroshot") == []
    assert training_log_path(piqa_workspace, "zeroshot") is None
    assert training_curves(piqa_workspace, "broken") == []  # failed before logging anything
    with pytest.raises(ResultsError, match="no run named"):
        training_curves(piqa_workspace, "nope")


def test_plot_curves_writes_a_png(piqa_workspace: Path, tmp_path: Path) -> None:
    target = tmp_path / "curves.png"
    drawn = plot_curves(piqa_workspace, ["trained", "zeroshot", "broken"], target)
    assert drawn == ["trained"]
    data = target.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000

    with pytest.raises(ResultsError, match="nothing to plot"):
        plot_curves(piqa_workspace, ["zeroshot", "broken"], tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()
