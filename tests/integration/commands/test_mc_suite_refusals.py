"""``tango run configs/mc_suite.jsonnet`` refuses a ``-D`` value that cannot be right before any
step starts. The same refusals when the steps are built are ``tests/test_mc_suite_config.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_mc_suite_config import MC_SUITE, REPO_ROOT


@pytest.mark.slow
def test_tango_run_refuses_them_before_any_step_starts(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    cases = {
        "limit=-1": "limit must be 0 (all examples) or positive, got -1",
        "tasks=arc_easy,arc_easy": "-D tasks lists arc_easy more than once",
        "tasks=piqa,copa,arc_eesy": "unknown lm-eval task 'arc_eesy'; did you mean 'arc_easy'",
    }
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    processes = {
        define: subprocess.Popen(
            [sys.executable, "-m", "tango", "run", str(MC_SUITE), "-w", str(tmp_path / "ws")]
            + ["-D", f"model={tiny_model_dir}", "-D", "train_steps=0", "-D", define],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for define in cases
    }
    for define, process in processes.items():
        output, _ = process.communicate(timeout=180)
        assert process.returncode != 0, output
        assert any(cases[define] in line for line in output.splitlines()), output[-2000:]
        assert "Starting step" not in output, output[-2000:]
