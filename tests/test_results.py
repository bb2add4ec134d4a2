"""Tests for run inspection (``tango_fairscale.results``: workspace reader, run states, reports).

``results_workspace`` runs ``tango run`` three times into one workspace, once per test session
(``test_cli.py`` shares it): ``broken`` (``configs/gpt2_piqa.jsonnet``, 4 DDP steps on a model
directory that does not exist yet, so ``trained_model`` fails), ``trained`` (the same config once
the directory exists: the same unique ids, now completed) and ``suite``
(``configs/mc_suite.jsonnet``, no training, lm-eval's ``piqa`` and ``arc_easy`` on the fixtures).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import pickle
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from tango import Workspace

from tango_fairscale.results import (
    ResultsError,
    RunSummary,
    collect_runs,
    format_table,
    open_workspace,
    plot_curves,
    task_metrics,
    training_curves,
    training_log_path,
)
from tango_fairscale.results.workspace import (
    LocalReader,
    RunRecord,
    StepRecord,
    TangoReader,
    WorkspaceReader,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
TASKS = REPO_ROOT / "tests" / "fixtures" / "tasks"
TRAIN_STEPS = 4
LIMIT = 16
SUITE_LIMIT = 8


def _tango_run(
    workspace: Path,
    name: str,
    *,
    config: str = "configs/gpt2_piqa.jsonnet",
    fails: bool = False,
    **overrides: object,
) -> None:
    command = [sys.executable, "-m", "tango", "run", config, "-w", str(workspace), "-n", name]
    for key, value in {"limit": LIMIT, "engine": "ddp", **overrides}.items():
        command += ["-D", f"{key}={value}"]
    offline = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        command, cwd=REPO_ROOT, env={**os.environ, **offline}, capture_output=True, text=True
    )
    # What the terminal showed, for tests of the display (tests/train/test_progress.py).
    (workspace.parent / f"{name}.out").write_text(done.stdout + done.stderr)
    if (done.returncode != 0) != fails:
        raise RuntimeError(
            f"tango run {name} exited with {done.returncode}:\n{done.stdout[-3000:]}\n"
            f"{done.stderr[-3000:]}"
        )


def build_workspace(base: Path, model_dir: Path, piqa_dir: Path) -> Path:
    """The three runs in ``base/workspace``, built once (a marker file records completion)."""
    workspace, marker = base / "workspace", base / "workspace.done"
    if marker.is_file():
        return workspace
    train = {"data_dir": piqa_dir, "train_steps": TRAIN_STEPS, "batch_size": 4, "lr": 1e-3}
    train.update(validate_every=2, model=model_dir)
    # The train step fails (a batch of 4 does not split over 3 processes) after the run is
    # registered: Tango records the failure and exits non-zero. device_count is not part of the
    # step's cache key, so "trained" then completes the very same steps.
    _tango_run(workspace, "broken", fails=True, device_count=3, **train)
    _tango_run(workspace, "trained", **train)
    _tango_run(
        workspace,
        "suite",
        config="configs/mc_suite.jsonnet",
        model=model_dir,
        tasks="piqa,arc_easy",
        task_data_dir=TASKS,
        train_steps=0,
        limit=SUITE_LIMIT,
    )
    marker.touch()
    return workspace


@pytest.fixture(scope="session")
def results_workspace(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, piqa_dir: Path
) -> Path:
    return build_workspace(tmp_path_factory.getbasetemp(), tiny_model_dir, piqa_dir)


def test_the_direct_reader_agrees_with_tango(results_workspace: Path) -> None:
    fast = open_workspace(results_workspace)
    workspace = Workspace.from_url(str(results_workspace))
    slow = TangoReader(workspace)
    assert isinstance(fast, LocalReader) and fast.url == workspace.url
    assert (
        sorted(fast.run_names())
        == sorted(workspace.registered_runs())
        == ["broken", "suite", "trained"]
    )
    results = []
    for name, run in workspace.registered_runs().items():
        record = fast.run(name)
        assert record == slow.run(name)  # names, start date, every field of every step info
        assert record.start_date == run.start_date
        assert {step: info.state.value for step, info in run.steps.items()} == {
            step: info.state for step, info in record.steps.items()
        }
        for step, info in run.steps.items():
            assert record.steps[step].config == info.config
            assert record.steps[step].end_time == info.end_time
            if info not in workspace.step_cache:
                continue
            if step in ("piqa", "trained_model") or step.startswith(("requests", "tokens")):
                with pytest.raises(ValueError, match="a result stored as .*, not JSON"):
                    fast.result(record, step)
                continue
            assert fast.result(record, step) == workspace.step_result_for_run(name, step)
            results.append(f"{name}/{step}")
    # "broken" differs from "trained" only in device_count, which is not in a step's key.
    assert sorted(results) == [
        f"{run}/{step}"
        for run, steps in (
            ("broken", ("metrics", "predictions")),
            ("suite", ("metrics", "scores_arc_easy", "scores_piqa")),
            ("trained", ("metrics", "predictions")),
        )
        for step in steps
    ]  # fmt: skip


def test_collect_runs_reads_configuration_status_and_metrics(
    results_workspace: Path, tiny_model_dir: Path
) -> None:
    workspace = Workspace.from_url(str(results_workspace))
    summaries = {s.name: s for s in collect_runs(results_workspace)}
    assert list(summaries) == ["broken", "trained", "suite"]  # oldest first
    trained, suite = summaries["trained"], summaries["suite"]
    for summary in (trained, suite):
        assert summary.status == "completed" and summary.error is None
        assert summary.metrics == workspace.step_result_for_run(summary.name, "metrics")
        assert summary.wall_time_s is not None and summary.wall_time_s > 0
    assert trained.model == str(tiny_model_dir)
    assert trained.num_examples == LIMIT
    assert trained.acc == trained.metrics["acc"] and trained.acc_norm == trained.metrics["acc_norm"]
    assert (trained.engine, trained.device_count, trained.train_steps) == ("ddp", 1, TRAIN_STEPS)
    assert (trained.batch_size, trained.lr, trained.seed) == (4, 1e-3, 42)
    # What `auto` resolved to on this machine, as the train step recorded it (run_info.json).
    assert (trained.precision, trained.precision_recorded) == ("32-true", True)
    assert trained.train_time_s is not None and 0 < trained.train_time_s < trained.wall_time_s
    assert trained.training_log is not None and Path(trained.training_log).is_file()
    assert trained.host and trained.steps["piqa"].reused  # broken loaded the documents
    assert [t.task for t in trained.tasks] == ["piqa"]

    assert suite.model == str(tiny_model_dir)
    assert (suite.engine, suite.device_count, suite.train_steps, suite.batch_size) == (
        None,
        None,
        0,
        None,
    )
    assert suite.requested_precision == "auto" and suite.training_log is None
    assert [(t.task, t.n_shot, t.examples) for t in suite.tasks] == [
        ("piqa", 0, SUITE_LIMIT),
        ("arc_easy", 0, SUITE_LIMIT),
    ]
    for task in suite.tasks:
        assert set(task.values) == {"acc", "acc_norm"}
        assert task.values["acc"] == (
            suite.metrics[f"{task.task}/acc"],
            suite.metrics[f"{task.task}/acc_stderr"],
        )


def test_a_failed_run_is_not_completed_by_a_later_runs_steps(results_workspace: Path) -> None:
    """``trained`` completed the very steps that ``broken`` failed on (same unique ids): Tango's
    step infos now say every step of ``broken`` completed; its own attempt did not."""
    run = Workspace.from_url(str(results_workspace)).registered_run("broken")
    assert {info.state.value for info in run.steps.values()} == {"completed"}
    broken = collect_runs(results_workspace, ["broken"])[0]
    assert broken.status == "failed: trained_model"
    assert broken.metrics is None and broken.acc is None and broken.tasks == []
    assert broken.error is not None and broken.error.startswith("trained_model: ")
    assert "batch_size 4 must be divisible by device_count" in broken.error
    assert broken.steps["trained_model"].superseded
    assert broken.steps["metrics"].state == "incomplete"
    assert broken.train_time_s is None and broken.training_log is None
    assert training_log_path(results_workspace, "broken") is None  # that log is trained's
    assert broken.wall_time_s is not None and broken.wall_time_s < 60


def test_collect_runs_selects_runs_in_the_given_order(results_workspace: Path) -> None:
    names = [s.name for s in collect_runs(results_workspace, ["suite", "trained", "suite"])]
    assert names == ["suite", "trained"]
    with pytest.raises(ResultsError, match="no run named 'nope'.*broken, suite, trained"):
        collect_runs(results_workspace, ["nope"])


def test_workspace_urls_and_missing_workspaces(results_workspace: Path, tmp_path: Path) -> None:
    assert (
        open_workspace(f"local://{results_workspace}").url == open_workspace(results_workspace).url
    )
    tango_view = collect_runs(Workspace.from_url(str(results_workspace)))  # a Workspace instance
    assert [s.status for s in tango_view] == [s.status for s in collect_runs(results_workspace)]
    missing = tmp_path / "missing"
    with pytest.raises(ResultsError, match="no Tango workspace"):
        collect_runs(missing)
    assert not missing.exists()  # never created as a side effect
    with pytest.raises(ResultsError, match="unknown workspace type 'nosuch'"):
        open_workspace("nosuch://somewhere")
    Workspace.from_url(str(tmp_path / "empty"))
    with pytest.raises(ResultsError, match="has no registered runs"):
        collect_runs(tmp_path / "empty")


def test_format_table_shows_runs_then_tasks_with_stderr(results_workspace: Path) -> None:
    summaries = {s.name: s for s in collect_runs(results_workspace)}
    runs_table, metrics_table = format_table(list(summaries.values())).split("\n\n")
    lines = runs_table.splitlines()
    assert len(lines) == 2 + len(summaries)
    for column in (
        "run",
        "status",
        "model",
        "engine",
        "precision",
        "devices",
        "train steps",
        "batch",
        "lr",
        "seed",
        "train time",
        "wall time",
    ):
        assert column in lines[0]
    rows = {line.split()[0]: line for line in lines[2:]}
    assert "failed: trained_model" in rows["broken"]
    assert " ddp " in rows["trained"] and " 32-true " in rows["trained"]
    assert " 0.001 " in rows["trained"] and " 42 " in rows["trained"]
    assert len({len(line) for line in rows.values()}) == 1  # right-aligned numbers end together

    lines = metrics_table.splitlines()
    assert lines[0].split() == ["run", "task", "n-shot", "acc", "acc_norm", "examples"]
    rows = {tuple(line.split()[:2]): line for line in lines[2:]}
    assert list(rows) == [("trained", "piqa"), ("suite", "piqa"), ("suite", "arc_easy")]
    trained, suite = summaries["trained"], summaries["suite"]
    assert f"{trained.acc:.4f} ± {trained.metrics['acc_stderr']:.4f}" in rows["trained", "piqa"]
    acc, stderr = suite.metrics["arc_easy/acc_norm"], suite.metrics["arc_easy/acc_norm_stderr"]
    assert f"{acc:.4f} ± {stderr:.4f}" in rows["suite", "arc_easy"]
    assert rows["suite", "arc_easy"].endswith(f" {SUITE_LIMIT}")


def test_json_is_lm_evals_shape_with_the_run_configuration(results_workspace: Path) -> None:
    summaries = {s.name: s for s in collect_runs(results_workspace)}
    suite = json.loads(json.dumps(summaries["suite"].to_json()))
    lm_eval = summaries["suite"].metrics["lm_eval"]
    for key in ("results", "groups", "n-shot", "n-samples", "versions", "higher_is_better"):
        assert suite[key] == lm_eval[key]
    assert suite["results"]["arc_easy"]["acc_stderr,none"] > 0
    assert (
        suite["metrics"]["piqa/num_examples"] == SUITE_LIMIT and "lm_eval" not in suite["metrics"]
    )
    trained = summaries["trained"].to_json()
    assert trained["config"]["batch_size"] == 4 and trained["config"]["lr"] == 1e-3
    assert trained["steps"]["trained_model"]["state"] == "completed"
    broken = summaries["broken"].to_json()
    assert broken["status"] == "failed: trained_model" and broken["metrics"] is None
    assert "results" not in broken and broken["steps"]["trained_model"]["start_time"] is None


def test_run_info_gives_the_resolved_precision(results_workspace: Path, tmp_path: Path) -> None:
    copy = tmp_path / "workspace"
    shutil.copytree(results_workspace, copy, symlinks=True)
    unique_id = json.loads((copy / "runs" / "trained" / "stepinfo.json").read_text())[
        "trained_model"
    ]
    info = {"precision": "bf16-mixed", "world_size": 2}
    (copy / "cache" / unique_id / "work" / "run_info.json").write_text(json.dumps(info))
    trained = collect_runs(copy, ["trained"])[0]
    assert (trained.precision, trained.requested_precision) == ("bf16-mixed", "auto")
    assert trained.precision_recorded and trained.device_count == 2
    assert " bf16-mixed " in format_table([trained]).splitlines()[2]


def test_training_curves_hold_the_logged_steps(results_workspace: Path) -> None:
    curves = training_curves(results_workspace, "trained")
    # train_loss after step 1 and the last step; validation every 2 steps and after the last.
    assert [r["step"] for r in curves] == [1, 2, 4]
    assert [r["step"] for r in curves if "train_loss" in r] == [1, 4]
    assert [r["step"] for r in curves if "val_piqa/acc" in r] == [2, 4]
    assert all(r["val_piqa/num_examples"] == LIMIT for r in curves if "val_piqa/acc" in r)
    # The last in-training validation and the metrics step score the same model on the same split.
    metrics = Workspace.from_url(str(results_workspace)).step_result_for_run("trained", "metrics")
    assert curves[-1]["val_piqa/acc"] == pytest.approx(metrics["piqa/acc"])
    assert curves[-1]["val_acc_norm"] == pytest.approx(metrics["acc_norm"])

    path = training_log_path(results_workspace, "trained")
    assert path is not None and path.name == "training_log.jsonl"
    assert training_curves(results_workspace, "suite") == []
    assert training_log_path(results_workspace, "suite") is None
    assert training_curves(results_workspace, "broken") == []
    with pytest.raises(ResultsError, match="no run named"):
        training_curves(results_workspace, "nope")


def test_plot_curves_writes_a_png(results_workspace: Path, tmp_path: Path) -> None:
    target = tmp_path / "curves.png"
    assert plot_curves(results_workspace, ["trained", "suite", "broken"], target) == ["trained"]
    data = target.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000

    with pytest.raises(ResultsError, match="nothing to plot"):
        plot_curves(results_workspace, ["suite", "broken"], tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()


def test_task_metrics_reads_groups_filters_and_missing_stderr() -> None:
    lm_eval = {
        "results": {
            "mmlu": {"alias": "mmlu", "acc,none": 0.3, "acc_stderr,none": 0.01},
            "mmlu_anatomy": {"alias": " - anatomy", "acc,none": 0.25, "acc_stderr,none": "N/A"},
            "cola": {"mcc,none": 0.1, "mcc_stderr,none": 0.02, "acc,strict": 0.5},
        },
        "groups": {"mmlu": {"acc,none": 0.3, "acc_stderr,none": 0.01}},
        "n-shot": {"mmlu_anatomy": 2, "cola": 0},
        "n-samples": {"mmlu_anatomy": {"original": 135, "effective": 20}, "cola": {"effective": 9}},
    }
    rows = {row.task: row for row in task_metrics({"lm_eval": lm_eval})}
    assert list(rows) == ["mmlu", "mmlu_anatomy", "cola"] and rows["mmlu"].group
    assert rows["mmlu_anatomy"].values == {"acc": (0.25, None)}
    assert (rows["mmlu_anatomy"].n_shot, rows["mmlu_anatomy"].examples) == (2, 20)
    assert rows["cola"].values == {"mcc": (0.1, 0.02), "acc,strict": (0.5, None)}
    # A flat summary without lm-eval's JSON (older metrics results).
    flat = task_metrics({"acc": 0.5, "acc_stderr": 0.1, "acc_norm": 0.4, "num_examples": 8})
    assert [(r.task, r.values, r.examples) for r in flat] == [
        ("-", {"acc": (0.5, 0.1), "acc_norm": (0.4, None)}, 8)
    ]


# --- a run's own step states, on step infos made up for each case -------------------------------

T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone.utc)


def _at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


class FakeReader(WorkspaceReader):
    url = "fake://workspace"

    def __init__(self, run: RunRecord, failures: dict, locked: bool = False) -> None:
        self._run, self._failures, self._locked = run, failures, locked

    def run_names(self) -> list[str]:
        return [self._run.name]

    def run(self, name: str) -> RunRecord:
        if name != self._run.name:
            raise KeyError(name)
        return self._run

    def result(self, run: RunRecord, step_name: str) -> dict:
        return {"acc": 0.5, "num_examples": 4}

    def lock_held(self, step: StepRecord) -> bool:
        return self._locked

    def logged_failures(self, run: RunRecord) -> dict:
        return self._failures


def _summary(train: tuple, metrics: tuple, failures: dict | None = None, **kw) -> RunSummary:
    """A run logging from T0+10 s to T0+20 s; steps as (start, end, error) seconds after T0."""

    def step(name: str, times: tuple, config: dict) -> StepRecord:
        start, end, error = times
        return StepRecord(
            name,
            f"{name}-id",
            start_time=None if start is None else _at(start),
            end_time=None if end is None else _at(end),
            error=error,
            config=config,
        )

    steps = {
        "trained_model": step("trained_model", train, {"type": "tango_fairscale::train"}),
        "metrics": step("metrics", metrics, {"type": "tango_fairscale::task_metrics"}),
    }
    run = RunRecord("run", _at(10), steps, log_end=_at(20))
    return collect_runs(FakeReader(run, failures or {}, **kw))[0]


@pytest.mark.parametrize(
    ("train", "metrics", "failures", "status", "wall"),
    [
        # Both steps executed by this run.
        ((11, 15, None), (16, 18, None), None, "completed", 7.0),
        (
            (11, 15, "Traceback\nValueError: boom"),
            (None, None, None),
            None,
            "failed: trained_model",
            4.0,
        ),
        # Both completed before the run began: reused, nothing executed.
        ((1, 5, None), (6, 8, None), None, "completed", 0.0),
        # Redone by a later run after this run's attempt failed, or was killed.
        (
            (30, 35, None),
            (36, 37, None),
            {"trained_model": "ValueError: boom"},
            "failed: trained_model",
            10.0,
        ),
        ((30, 35, None), (36, 37, None), None, "incomplete", 10.0),
        # A failure from before the run that it did not retry is not its own.
        ((1, 5, "ValueError: old"), (None, None, None), None, "incomplete", None),
    ],
)
def test_a_runs_state_is_its_own(train, metrics, failures, status, wall) -> None:
    summary = _summary(train, metrics, failures)
    assert summary.status == status
    assert summary.wall_time_s == (None if wall is None else pytest.approx(wall))
    assert (summary.metrics is not None) == (status == "completed")
    if status.startswith("failed"):
        assert summary.error == "trained_model: ValueError: boom"


@pytest.mark.parametrize(
    ("locked", "status"), [(True, "running"), (False, "interrupted: trained_model")]
)
def test_a_step_marked_running_is_running_only_while_locked(locked: bool, status: str) -> None:
    assert _summary((11, None, None), (None, None, None), locked=locked).status == status


def test_lock_held_sees_another_holder(tmp_path: Path) -> None:
    import fcntl

    (tmp_path / "runs").mkdir()
    (tmp_path / "cache" / "step-id").mkdir(parents=True)
    reader = open_workspace(tmp_path)
    step = StepRecord("step", "step-id", start_time=T0)
    assert reader.lock_held(step) is False  # no lock file
    with (tmp_path / "cache" / "step-id" / "lock").open("w") as lock:
        assert reader.lock_held(step) is False
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert reader.lock_held(step) is True


def test_step_infos_that_name_other_globals_are_refused(tmp_path: Path) -> None:
    """The step info unpickler builds stand-ins of Tango's classes and executes nothing else."""
    marker = tmp_path / "executed"

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    (tmp_path / "runs" / "evil").mkdir(parents=True)
    (tmp_path / "runs" / "evil" / "stepinfo.json").write_text(json.dumps({"metrics": "evil-id"}))
    with sqlite3.connect(tmp_path / "stepinfo.sqlite") as database:
        database.execute('CREATE TABLE "unnamed" (key TEXT PRIMARY KEY, value BLOB)')
        database.execute(
            'INSERT INTO "unnamed" VALUES (?, ?)', ("evil-id", pickle.dumps(Exploit()))
        )
    with pytest.raises(
        ResultsError, match=r"evil-id .* refers to posix\.system, which the results"
    ):
        collect_runs(tmp_path)
    assert not marker.exists()


def test_a_planted_metrics_result_runs_nothing(results_workspace: Path, tmp_path: Path) -> None:
    """A ``_dataclass`` entry in a stored metrics result (which Tango's ``JsonFormat`` turns into a
    call of what it names) is read as data; a result whose ``cache-metadata.json`` names another
    format (Tango's ``DillFormat``, over a pickle) is not read: its run shows no metrics."""
    from helpers.hostile_pickles import calling_pickle

    copy = shutil.copytree(results_workspace, tmp_path / "workspace", symlinks=True)
    marker = tmp_path / "ran"
    metrics_id = json.loads((copy / "runs" / "suite" / "stepinfo.json").read_text())["metrics"]
    directory = copy / "cache" / metrics_id
    stored = json.loads((directory / "data.json").read_text())
    planted = {"_dataclass": ["os", "system"], "command": f"touch {marker}"}
    (directory / "data.json").write_text(json.dumps({**stored, "planted": planted}))
    suite = {s.name: s for s in collect_runs(copy)}["suite"]
    assert suite.metrics == {**stored, "planted": planted}
    metadata = json.loads((directory / "cache-metadata.json").read_text())
    (directory / "cache-metadata.json").write_text(
        json.dumps({**metadata, "format": {"type": "dill"}})
    )
    (directory / "data.dill").write_bytes(calling_pickle("os", "system", marker))
    suite = {s.name: s for s in collect_runs(copy)}["suite"]
    assert suite.metrics is None
    assert not marker.exists()


def test_importing_results_imports_neither_torch_nor_tango(results_workspace: Path) -> None:
    code = (
        "import sys, time; t = time.perf_counter(); import tango_fairscale.results as r; "
        "t = time.perf_counter() - t; r.format_table(r.collect_runs(sys.argv[1])); "
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'tango')); "
        "print(t, heavy)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(results_workspace)],
        capture_output=True,
        text=True,
        check=True,
    )
    seconds, heavy = done.stdout.split(" ", 1)
    assert heavy.strip() == "[]"
    assert float(seconds) < 1.0
    timed = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import tango_fairscale.results"],
        capture_output=True,
        text=True,
        check=True,
    )
    line = next(
        x for x in timed.stderr.splitlines() if x.rstrip().endswith("| tango_fairscale.results")
    )
    assert int(line.split("|")[1]) < 1_000_000  # cumulative microseconds


# --- distinct results: reruns folded, curves labelled by what differs, tasks and limit ----------


def _with_reruns(results_workspace: Path, tmp_path: Path, count: int = 2) -> Path:
    """A copy of the workspace where ``trained`` was run ``count`` more times, every step cached
    (a run directory registered after its steps ran: what a rerun of the same command leaves)."""
    copy = tmp_path / "workspace"
    shutil.copytree(results_workspace, copy, symlinks=True)
    for number in range(1, count + 1):
        shutil.copytree(copy / "runs" / "trained", copy / "runs" / f"again{number}", symlinks=True)
    return copy


class RunsReader(FakeReader):
    def __init__(self, runs: list[RunRecord]) -> None:
        super().__init__(runs[0], {})
        self._runs = {run.name: run for run in runs}

    def run_names(self) -> list[str]:
        return list(self._runs)

    def run(self, name: str) -> RunRecord:
        return self._runs[name]


def _run(name: str, registered: float, metrics_id: str, ran: tuple | None) -> RunRecord:
    """A run registered ``registered`` s after T0 whose train and metrics steps (the latter's id
    ``metrics_id``) ran at ``ran`` = (start, end) s after T0: before it registered, a rerun."""
    start, end = ran or (registered + 1, registered + 2)
    steps = {
        step: StepRecord(step, uid, start_time=_at(start), end_time=_at(end), config={"type": kind})
        for step, uid, kind in (
            ("trained_model", f"train-{metrics_id}", "tango_fairscale::train"),
            ("metrics", metrics_id, "tango_fairscale::task_metrics"),
        )
    }
    return RunRecord(name, _at(registered), steps, log_end=_at(registered + 3))


def test_reruns_that_started_no_step_fold_into_their_original() -> None:
    from tango_fairscale.results import fold_reruns

    runs = [
        _run("first", 0, "m1", None),
        _run("other", 10, "m2", None),
        _run("again", 20, "m1", (1, 2)),  # every step reused: a rerun of "first"
        _run("orphan", 30, "m3", (1, 2)),  # a rerun whose original is not in the workspace
        _run("again2", 40, "m1", (1, 2)),
    ]
    summaries = collect_runs(RunsReader(runs))
    assert [s.wall_time_s for s in summaries] == [1.0, 1.0, 0.0, 0.0, 0.0]
    folded = fold_reruns(summaries)
    assert [(s.name, s.reruns) for s in folded] == [
        ("first", ("again", "again2")),
        ("other", ()),
        ("orphan", ()),
    ]
    rows = format_table(folded).split("\n\n")[0].splitlines()[2:]
    assert [row.split("  ")[0] for row in rows] == ["first (+2 reruns)", "other", "orphan"]


def test_two_reruns_draw_one_curve(
    results_workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tango_fairscale.results as results

    drawn: list[dict] = []
    monkeypatch.setattr(results, "draw_curves", lambda curves, path: drawn.append(dict(curves)))
    copy = _with_reruns(results_workspace, tmp_path)
    names = plot_curves(copy, ["trained", "again1", "again2", "suite"], tmp_path / "c.png")
    assert names == ["trained", "again1", "again2"]
    assert list(drawn[0]) == ["trained"]  # one curve, named by its run: nothing differs


def test_curve_labels_name_the_settings_that_differ(results_workspace: Path) -> None:
    from dataclasses import replace

    from tango_fairscale.results import labels

    trained = collect_runs(results_workspace, ["trained"])[0]
    runs = [
        trained,
        replace(trained, name="sharded", engine="fsdp2", device_count=2),
        replace(trained, name="slower", lr=1e-4),
        replace(trained, name="twin", lr=1e-4),
    ]
    assert labels(runs) == {
        "trained": "engine=ddp, devices=1, lr=0.001",
        "sharded": "engine=fsdp2, devices=2, lr=0.001",
        "slower": "slower: engine=ddp, devices=1, lr=0.0001",  # shared with twin: name first
        "twin": "twin: engine=ddp, devices=1, lr=0.0001",
    }
    assert labels([trained]) == {"trained": "trained"}


def test_the_runs_table_shows_tasks_and_limit(results_workspace: Path) -> None:
    summaries = {s.name: s for s in collect_runs(results_workspace)}
    assert (summaries["trained"].task_names, summaries["trained"].limit) == (("piqa",), LIMIT)
    assert summaries["suite"].task_names == ("piqa", "arc_easy")
    assert summaries["suite"].limit == SUITE_LIMIT
    lines = format_table(list(summaries.values())).split("\n\n")[0].splitlines()
    assert lines[0].split()[4:6] == ["tasks", "limit"]
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert rows["trained"][5:7] == ["piqa", str(LIMIT)]
    assert rows["suite"][5:7] == ["piqa,arc_easy", str(SUITE_LIMIT)]


def test_wall_time_starts_with_the_process(results_workspace: Path) -> None:
    """Model loading (before Tango registers the run and starts a step) is wall time too."""
    reader = open_workspace(results_workspace)
    for name in ("trained", "suite"):
        run = reader.run(name)
        summary = collect_runs(reader, [name])[0]
        own = [s.record.start_time for s in summary.steps.values() if s.own]
        assert run.started is not None and own and run.started < min(own)
        assert run.log_end is not None
        assert summary.wall_time_s == pytest.approx((run.log_end - run.started).total_seconds())
