"""Tests for the ``tango-fairscale`` command (``tango_fairscale.cli``): tables, JSON and plots of a
workspace's runs; every problem in one line (a run that cannot be read is left out with one
warning line; a plot file suffix matplotlib does not write is refused before any work)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tango import Step, Workspace
from tango.workspaces import LocalWorkspace

# The workspace is built once per session, shared with test_results.py (a marker file on disk).
from test_results import SUITE_LIMIT, build_workspace

from tango_fairscale.cli import main


@pytest.fixture(scope="session")
def results_workspace(
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


def test_tables_of_all_runs(results_workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "-w", str(results_workspace))
    assert code == 0 and err == ""
    runs, tasks = out.rstrip("\n").split("\n\n")
    assert [line.split()[0] for line in runs.splitlines()[2:]] == ["broken", "trained", "suite"]
    metrics = Workspace.from_url(str(results_workspace)).step_result_for_run("suite", "metrics")
    rows = {tuple(line.split()[:2]): line for line in tasks.splitlines()[2:]}
    for task in ("piqa", "arc_easy"):
        acc, stderr = metrics[f"{task}/acc"], metrics[f"{task}/acc_stderr"]
        assert f"{acc:.4f} ± {stderr:.4f}" in rows["suite", task]


def test_json_of_selected_runs(results_workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"local://{results_workspace}"
    code, out, err = run_cli(capsys, "-w", url, "--run", "suite", "--run", "trained", "--json")
    assert code == 0 and err == ""
    runs = json.loads(out)
    assert [r["name"] for r in runs] == ["suite", "trained"]
    workspace = Workspace.from_url(url)
    for run in runs:
        assert run["status"] == "completed"
        lm_eval = workspace.step_result_for_run(run["name"], "metrics")["lm_eval"]
        assert run["results"] == lm_eval["results"] and run["n-samples"] == lm_eval["n-samples"]
    assert runs[0]["n-samples"]["arc_easy"]["effective"] == SUITE_LIMIT
    assert runs[1]["config"]["engine"] == "ddp" and runs[1]["config"]["train_steps"] == 4
    assert runs[0]["config"]["train_steps"] == 0 and runs[0]["training_log"] is None


def test_plot(results_workspace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "curves.png"
    code, out, err = run_cli(capsys, "-w", str(results_workspace), "--plot", str(target))
    assert code == 0
    assert target.stat().st_size > 10_000
    assert "wrote curves of trained" in err and "no training log: broken, suite" in err
    assert len(out.split("\n\n")) == 2  # the tables are still printed


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--run", "nope"], ["no run named 'nope'", "runs: broken, suite, trained"]),
        (["--run", "suite", "--plot", "x.png"], ["nothing to plot", "suite"]),
        (["--run", "trained", "--plot", "missing-dir/x.png"], ["missing-dir/x.png"]),
    ],
)
def test_errors_in_a_workspace(
    results_workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    fragments: list[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "-w", str(results_workspace), *args)
    assert_one_line_error(code, out, err, *fragments)
    assert not (tmp_path / "x.png").exists()


def test_missing_and_empty_workspaces(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing"
    assert_one_line_error(*run_cli(capsys, "-w", str(missing)), "no Tango workspace", str(missing))
    assert not missing.exists()
    Workspace.from_url(str(tmp_path / "empty"))
    assert_one_line_error(*run_cli(capsys, "-w", str(tmp_path / "empty")), "no registered runs")


class Toy(Step):
    def run(self, x: int) -> int:  # type: ignore[override]
        return x


def toy_workspace(directory: Path, *runs: str) -> Path:
    """A workspace whose runs each registered one step of its own (nothing run)."""
    workspace = LocalWorkspace(directory)
    for number, name in enumerate(runs):
        workspace.register_run([Toy(step_name="metrics", x=number)], name)
    return directory


def truncate_step_info(workspace: Path, run: str) -> str:
    """Cut the pickled step info of ``run``'s step in ``stepinfo.sqlite``; its unique id."""
    unique_id = json.loads((workspace / "runs" / run / "stepinfo.json").read_text())["metrics"]
    with sqlite3.connect(workspace / "stepinfo.sqlite") as database:
        database.execute(
            'UPDATE "unnamed" SET value = substr(value, 1, 20) WHERE key = ?', (unique_id,)
        )
    return unique_id


@pytest.mark.parametrize("damage", ["stepinfo.json", "step info"])
def test_a_run_that_cannot_be_read_is_left_out_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    workspace = toy_workspace(tmp_path / "ws", "first", "broken", "last")
    ids = workspace / "runs" / "broken" / "stepinfo.json"
    if damage == "stepinfo.json":
        ids.write_text(ids.read_text()[:12])  # a run registered as the disk filled up, say
        reason = f"run broken: cannot read {ids}: "
    else:
        unique_id = truncate_step_info(workspace, "broken")
        reason = f"run broken: cannot read the step info of {unique_id} in "
    code, out, err = run_cli(capsys, "-w", str(workspace))
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()[2:]] == ["first", "last"]
    assert err.startswith(f"tango-fairscale: warning: left out {reason}") and err.count("\n") == 1
    assert_one_line_error(*run_cli(capsys, "-w", str(workspace), "--run", "broken"), reason)


@pytest.mark.parametrize("name", ["curves.txt", "curves"])
def test_a_plot_file_matplotlib_cannot_write_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """Checked before the workspace is read (this one does not exist)."""
    target = tmp_path / name
    code, out, err = run_cli(capsys, "-w", str(tmp_path / "missing"), "--plot", str(target))
    reason = "'.txt' is not a format matplotlib writes" if "." in name else "it has no suffix"
    assert_one_line_error(code, out, err, f"cannot plot to {target}: {reason}; end the file name")
    assert all(suffix in err for suffix in (".png", ".pdf", ".svg"))
    assert not target.exists() and not target.with_suffix(".png").exists()


def _console_command() -> list[str]:
    script = Path(sys.executable).with_name("tango-fairscale")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "tango_fairscale.cli"]


def test_console_script_exit_code(results_workspace: Path) -> None:
    """The installed ``tango-fairscale`` script: an error is one line on stderr, exit code 2."""
    done = subprocess.run(
        [*_console_command(), "results", "-w", str(results_workspace), "--run", "nope"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith("tango-fairscale: error: no run named 'nope'")
    assert done.stderr.count("\n") == 1


def test_results_starts_without_torch_or_tango(results_workspace: Path) -> None:
    """``tango-fairscale results`` reads a local workspace without importing torch or Tango."""
    code = (
        "import sys, time; t = time.perf_counter(); from tango_fairscale.cli import main; "
        "assert main(['results', '-w', sys.argv[1], '--json']) == 0; "
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'tango')); "
        "print(time.perf_counter() - t, heavy, file=sys.stderr)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(results_workspace)],
        capture_output=True,
        text=True,
        check=True,
    )
    seconds, heavy = done.stderr.split(" ", 1)
    assert heavy.strip() == "[]" and float(seconds) < 1.0
    assert len(json.loads(done.stdout)) == 3
    started = time.perf_counter()
    subprocess.run(
        [*_console_command(), "results", "-w", str(results_workspace)],
        check=True,
        capture_output=True,
    )
    assert time.perf_counter() - started < 2.0  # the whole command, interpreter start included


@pytest.mark.parametrize("seconds", ["0", "-5", "soon"])
def test_run_refuses_a_bad_rendezvous_timeout(seconds: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--rendezvous-timeout", seconds, "configs/gpt2_piqa.jsonnet"])
    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"must be a positive number of seconds, got {seconds!r}" in error
