"""Commands run as a user runs them, from the repository root: one at a time, or several refusals
side by side."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_command(command: list[str], **env: str) -> subprocess.CompletedProcess:
    """``command`` run to its end (one intra-op thread, ``env`` added), its output captured."""
    return subprocess.run(
        command,
        cwd=REPO_ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def assert_tango_run_refuses(
    arguments: list[str], cases: dict[str, str], timeout_s: float = 180
) -> None:
    """``tango run ARGUMENTS -D define`` for each ``define: message`` of ``cases``, side by side:
    each fails with a line holding its message, before any step starts."""
    processes = {
        define: subprocess.Popen(
            [sys.executable, "-m", "tango", "run", *arguments, "-D", define],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        for define in cases
    }
    for define, process in processes.items():
        output, _ = process.communicate(timeout=timeout_s)
        assert process.returncode != 0, output
        assert any(cases[define] in line for line in output.splitlines()), output[-2000:]
        assert "Starting step" not in output, output[-2000:]
