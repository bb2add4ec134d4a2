"""``tango-fairscale clean`` on a workspace ``tango run`` built, then ``tango run`` again in it.
The cleaning itself is ``tests/test_clean.py``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_clean import clean

from tango_fairscale.cli import main


@pytest.mark.slow
def test_clean_a_tango_run_workspace_then_run_again(
    tmp_path_factory, tmp_path: Path, tiny_model_dir: Path, piqa_dir: Path, capsys
) -> None:
    """``test_results.py``'s workspace (``broken`` failed the training step that ``trained``
    then completed; ``suite`` trains nothing): the finished step's model-only checkpoint goes
    with ``--all-checkpoints``; ``tango run`` again starts no step, ``results`` reads every run,
    ``export --run`` says the checkpoints were deleted."""
    from test_results import TRAIN_STEPS, _tango_run, build_workspace

    from tango_fairscale.results import collect_runs

    built = build_workspace(tmp_path_factory.getbasetemp(), tiny_model_dir, piqa_dir)
    workspace = tmp_path / "workspace"
    shutil.copytree(built, workspace, symlinks=True)
    before = {s.name: (s.status, s.metrics) for s in collect_runs(workspace)}
    code, lines = clean(capsys, "-w", workspace, "--run", "trained")
    assert code == 0 and lines[0] == "trained_model of runs broken, trained: nothing to free"
    code, lines = clean(capsys, "-w", workspace, "--run", "suite", "--all-checkpoints")
    assert lines == ["no training step of run suite holds checkpoints or weights"]
    code, lines = clean(capsys, "-w", workspace, "--all-checkpoints")
    assert code == 0 and lines[0].startswith("trained_model of runs broken, trained: freed ")
    assert "(every checkpoint " in lines[0]
    assert {s.name: (s.status, s.metrics) for s in collect_runs(workspace)} == before

    train = {"data_dir": piqa_dir, "train_steps": TRAIN_STEPS, "batch_size": 4, "lr": 1e-3}
    _tango_run(workspace, "again", validate_every=2, model=tiny_model_dir, **train)
    output = (workspace.parent / "again.out").read_text()
    assert 'Starting step "' not in output and "trained_model" in output, output[-2000:]
    assert main(["export", "--run", "trained", "-w", str(workspace), str(tmp_path / "hf")]) == 2
    assert "its checkpoints were deleted" in capsys.readouterr().err
