"""Tests for the ``tango-fairscale`` command (``tango_fairscale.cli``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tango import Workspace

# The workspace is built once per session, shared with test_results.py (a marker file on disk).
from test_results import LIMIT, build_workspace

from tango_fairscale.cli import main


@pytest.fixture(scope="session")
def piqa_workspace(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, piqa_dir: Path
) -> Path:
    return build_workspace(tmp_path_factory.getbasetemp(), tiny_model_dir, piqa_dir)


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["results", *args])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, out: str, err: str, *fragments: str) -> None:
    assert code == 2
    assert out == ""
    assert err.startswith("tango-fairscale: error: ") and err.count("\n") == 1
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err


def test_table_of_all_runs(piqa_workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "-w", str(piqa_workspace))
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert [line.split()[0] for line in lines[2:]] == ["trained", "zeroshot", "broken"]
    metrics = Workspace.from_url(str(piqa_workspace)).step_result_for_run("zeroshot", "metrics")
    assert f"{metrics['acc']:.4f}" in lines[3] and f"{metrics['acc_norm']:.4f}" in lines[3]


def test_json_of_selected_runs(piqa_workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"local://{piqa_workspace}"
    code, out, err = run_cli(capsys, "-w", url, "--run", "zeroshot", "--run", "trained", "--json")
    assert code == 0 and err == ""
    runs = json.loads(out)
    assert [r["name"] for r in runs] == ["zeroshot", "trained"]
    workspace = Workspace.from_url(url)
    for run in runs:
        assert run["status"] == "completed"
        assert run["metrics"] == workspace.step_result_for_run(run["name"], "metrics")
        assert run["metrics"]["num_examples"] == LIMIT
    assert runs[1]["engine"] == "ddp" and runs[1]["train_steps"] == 4
    assert runs[0]["train_steps"] == 0 and runs[0]["training_log"] is None


def test_plot(piqa_workspace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "curves.png"
    code, out, err = run_cli(capsys, "-w", str(piqa_workspace), "--plot", str(target))
    assert code == 0
    assert target.stat().st_size > 10_000
    assert "wrote curves of trained" in err and "no training log: zeroshot, broken" in err
    assert len(out.splitlines()) == 5  # the table is still printed


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--run", "nope"], ["no run named 'nope'", "runs: broken, trained, zeroshot"]),
        (["--run", "zeroshot", "--plot", "x.png"], ["nothing to plot", "zeroshot"]),
        (["--run", "trained", "--plot", "missing-dir/x.png"], ["missing-dir/x.png"]),
    ],
)
def test_errors_in_a_workspace(
    piqa_workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    fragments: list[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "-w", str(piqa_workspace), *args)
    assert_one_line_error(code, out, err, *fragments)
    assert not (tmp_path / "x.png").exists()


def test_missing_and_empty_workspaces(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing"
    assert_one_line_error(*run_cli(capsys, "-w", str(missing)), "no Tango workspace", str(missing))
    assert not missing.exists()
    Workspace.from_url(str(tmp_path / "empty"))
    assert_one_line_error(*run_cli(capsys, "-w", str(tmp_path / "empty")), "no registered runs")


def test_console_script_exit_code(piqa_workspace: Path) -> None:
    """The installed ``tango-fairscale`` script: an error is one line on stderr, exit code 2."""
    script = Path(sys.executable).with_name("tango-fairscale")
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "tango_fairscale.cli"]
    done = subprocess.run(
        [*command, "results", "-w", str(piqa_workspace), "--run", "nope"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith("tango-fairscale: error: no run named 'nope'")
    assert done.stderr.count("\n") == 1


@pytest.mark.parametrize("seconds", ["0", "-5", "soon"])
def test_run_refuses_a_bad_rendezvous_timeout(seconds: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--rendezvous-timeout", seconds, "configs/gpt2_piqa.jsonnet"])
    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"must be a positive number of seconds, got {seconds!r}" in error
