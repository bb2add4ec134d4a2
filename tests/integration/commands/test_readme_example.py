"""The README's worked example of local task files ("The task library"), as written: its files
load as the tasks' documents (default tier) and the whole block runs — ``tango run`` of
``mc_suite`` on them, then ``tango-fairscale results`` (slow tier)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = re.compile(
    r"<!-- worked example -->\n```bash\n(.*?)```\n<!-- end of worked example -->", re.S
)


def example() -> str:
    found = EXAMPLE.search((REPO_ROOT / "README.md").read_text())
    assert found, "the README lost its worked example"
    return found.group(1)


def run_block(block: str, directory: Path, model_dir: Path) -> subprocess.CompletedProcess:
    """``block`` in ``directory``, set up as the repository root after the Quick start: the
    configs and tango.yml, and ``models/tiny-gpt2`` (here the tests' tiny model)."""
    for name in ("configs", "tango.yml"):
        (directory / name).symlink_to(REPO_ROOT / name)
    (directory / "models").mkdir()
    (directory / "models" / "tiny-gpt2").symlink_to(model_dir)
    bin_dir = str(Path(sys.executable).parent)  # tango, tango-fairscale
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        ["bash", "-e", "-c", block], cwd=directory, env=env, capture_output=True, text=True
    )


def test_the_examples_files_are_the_tasks_documents(tmp_path: Path, tiny_model_dir: Path) -> None:
    from tango_fairscale.tasks.lm_eval import TaskSpec, load_tasks

    files_only = example().split("tango run")[0]
    done = run_block(files_only, tmp_path, tiny_model_dir)
    assert done.returncode == 0, done.stderr
    scored = {"arc_easy": "test", "copa": "validation"}
    for name, split in scored.items():
        task = load_tasks(TaskSpec(name=name, data_dir=str(tmp_path / "my_tasks" / name)))
        docs = list(getattr(task["tasks"][name], f"{split}_docs")())
        assert len(docs) == 2


@pytest.mark.slow  # one tango run (~10 s)
def test_the_worked_example_runs_as_written(tmp_path: Path, tiny_model_dir: Path) -> None:
    done = run_block(example(), tmp_path, tiny_model_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split() for line in done.stdout.splitlines()]
    tasks = [row[1] for row in rows if len(row) > 2 and row[1] in ("arc_easy", "copa")]
    assert tasks == ["arc_easy", "copa"]
    assert any(row[-1] == "2" for row in rows if len(row) > 2 and row[1] == "copa")
