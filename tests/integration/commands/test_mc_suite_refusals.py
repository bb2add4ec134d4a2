"""``tango run configs/mc_suite.jsonnet`` refuses a ``-D`` value that cannot be right before any
step starts. The same refusals when the steps are built are ``tests/test_mc_suite_config.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.commands import assert_tango_run_refuses
from test_mc_suite_config import MC_SUITE


@pytest.mark.slow
def test_tango_run_refuses_them_before_any_step_starts(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    cases = {
        "limit=-1": "or a fraction of each task's below 1 (0.1), got -1",
        "tasks=arc_easy,arc_easy": "-D tasks lists arc_easy more than once",
        "tasks=piqa,copa,arc_eesy": "unknown lm-eval task 'arc_eesy'; did you mean 'arc_easy'",
    }
    defines = ["-w", str(tmp_path / "ws"), "-D", f"model={tiny_model_dir}", "-D", "train_steps=0"]
    assert_tango_run_refuses([str(MC_SUITE), *defines], cases)
