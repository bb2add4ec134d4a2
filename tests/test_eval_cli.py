"""``tango-fairscale eval`` (``tango_fairscale.eval_cli``): lm-eval's command line over
``configs/mc_suite.jsonnet``. Bad arguments are refused in one line before any work; the results
JSON lands where lm-eval 0.4.13's ``EvaluationTracker`` puts it. As a command on two fixture
tasks (it prints lm-eval's table, loads the model once, and ``tango run configs/mc_suite.jsonnet``
with the same settings in the same workspace starts no step and gives the same metrics):
``tests/integration/commands/test_eval_command.py``."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
from dataclasses import asdict
from pathlib import Path

import pytest

from tango_fairscale.cli import main
from tango_fairscale.eval_cli import tango_arguments
from tango_fairscale.eval_results import write_results

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "tasks"


def eval_args(*args: str) -> argparse.Namespace:
    from tango_fairscale.cli import build_parser

    return build_parser().parse_args(["eval", *args])


def assert_one_line_error(code: int, err: str, fragment: str) -> None:
    assert code == 2
    assert err.startswith("tango-fairscale: error: ") and err.count("\n") == 1, err
    assert fragment in err, err


@pytest.mark.parametrize(
    ("option", "fragment"),
    [
        (["--limit", "0.5"], "argument --limit: must be a whole number >= 0, got '0.5'"),
        (["--num_fewshot", "-1"], "argument --num_fewshot: must be a whole number >= 0"),
        (["--batch_size", "0"], "argument --batch_size: must be a positive whole number"),
        (["--precision", "fp8"], "argument --precision: invalid choice: 'fp8'"),
        (["--engine", "deepspeed"], "argument --engine: invalid choice: 'deepspeed'"),
    ],
)
def test_malformed_arguments_are_refused_by_the_parser(
    capsys: pytest.CaptureFixture[str], option: list[str], fragment: str
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["eval", "--model", "m", "--tasks", "copa", *option])
    assert done.value.code == 2
    assert fragment in capsys.readouterr().err.splitlines()[-1]


@pytest.mark.parametrize(
    ("tasks", "model", "fragment"),
    [
        ("copa,arc_eesy", None, "unknown lm-eval task 'arc_eesy'; did you mean 'arc_easy'"),
        ("copa,copa", None, "-D tasks lists copa more than once; list each task once"),
        ("copa", "/no/such/model", "cannot load model from path '/no/such/model'"),
    ],
)
def test_what_cannot_run_is_refused_in_one_line_before_any_work(
    tmp_path: Path,
    tiny_model_dir: Path,
    capsys: pytest.CaptureFixture[str],
    tasks: str,
    model: str | None,
    fragment: str,
) -> None:
    workspace = tmp_path / "workspace"
    code = main(
        ["eval", "--model", model or str(tiny_model_dir), "--tasks", tasks]
        + ["--task_data_dir", str(FIXTURES), "-w", str(workspace)]
    )
    out, err = capsys.readouterr()
    assert_one_line_error(code, err, fragment)
    assert out == "" and not workspace.exists()  # no run was started


def test_an_output_path_that_cannot_be_written_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("")
    workspace = tmp_path / "workspace"
    code = main(
        ["eval", "--model", "m", "--tasks", "copa", "-w", str(workspace)]
        + ["--output_path", str(tmp_path / "file" / "results")]
    )
    assert_one_line_error(code, capsys.readouterr().err, f"--output_path {tmp_path}/file/results")
    assert not workspace.exists()


def test_the_tango_command_line_is_mc_suite_with_its_variables() -> None:
    args = eval_args(
        "--model", "/m", "--tasks", "copa, arc_easy", "--limit", "4", "--batch_size", "64"
    )
    argv = tango_arguments(args, "/ws", "eval-x")
    config = str(REPO_ROOT / "configs" / "mc_suite.jsonnet")
    assert argv[:4] == ["--settings", str(REPO_ROOT / "tango.yml"), "run", config]
    assert argv[4:8] == ["-w", "/ws", "-n", "eval-x"]
    defines = [argv[i + 1] for i, arg in enumerate(argv) if arg == "-D"]
    assert defines == [
        "model=/m",
        "tasks=copa,arc_easy",
        "num_fewshot=0",
        "limit=4",
        "train_steps=0",
    ]
    overrides = json.loads(argv[argv.index("-o") + 1])  # the scoring batch size: not in the key
    assert overrides == {"steps.scores_copa.batch_size": 64, "steps.scores_arc_easy.batch_size": 64}


@pytest.mark.parametrize("output", ["out.json", "results", "nested/dir"])
def test_the_results_file_is_where_lm_eval_writes_it(tmp_path: Path, output: str) -> None:
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.loggers.evaluation_tracker import GeneralConfigTracker

    base = {"results": {"copa": {"acc,none": 0.5}}, "versions": {"copa": 1}}
    model_args = "pretrained=/models/tiny:v1"
    tracker = EvaluationTracker(output_path=str(tmp_path / "lm_eval" / output))
    tracker.general_config_tracker.log_experiment_args("hf", model_args, None, None, False)
    tracker.save_results_aggregated(results=dict(base), samples=None)
    config = GeneralConfigTracker()
    config.log_experiment_args("tango_fairscale", model_args, None, None, False)
    ours = write_results(
        {**base, "task_hashes": {}, **asdict(config)}, str(tmp_path / "ours" / output)
    )

    def layout(root: Path) -> list[str]:
        files = [str(path.relative_to(root)) for path in root.rglob("*") if path.is_file()]
        return [re.sub(r"\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d\.\d+", "DATE", file) for file in files]

    assert layout(tmp_path / "ours") == layout(tmp_path / "lm_eval") != []
    theirs = json.loads(next((tmp_path / "lm_eval").rglob("*.json")).read_text())
    assert set(theirs) <= set(json.loads(ours.read_text()))


def run_command(command: list[str], cwd: Path) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    return output
