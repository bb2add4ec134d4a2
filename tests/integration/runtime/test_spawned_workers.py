"""Workers (``runtime.spawn.run_workers``) share the machine's cores, take the caller's environment,
die with their launcher and can use its GPU; a worker's error is one line that keeps the worker's
traceback as its cause."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tango_fairscale.runtime.spawn import WorkerFailed, run_workers


def record_threads(rank: int, directory: Path) -> None:
    import torch

    (directory / f"rank{rank}").write_text(str(torch.get_num_threads()))


@pytest.mark.parametrize("omp_num_threads", [None, "1"], ids=["unset", "set"])
def test_workers_take_their_share_of_the_cores_unless_omp_num_threads_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, omp_num_threads: str | None
) -> None:
    if omp_num_threads is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp_num_threads)
    run_workers(record_threads, (tmp_path,), 2, signal.SIGTERM)
    share = max(1, (os.cpu_count() or 1) // 2) if omp_num_threads is None else 1
    assert [int((tmp_path / f"rank{r}").read_text()) for r in range(2)] == [share, share]


def record_cuda_sum(rank: int, directory: Path) -> None:
    total = torch.arange(4.0, device="cuda").sum().item()
    (directory / f"rank{rank}").write_text(f"{total} {torch.cuda.is_initialized()}")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_workers_forked_from_the_server_use_the_gpu(tmp_path: Path) -> None:
    """The server imports the training code without initialising CUDA, so its forks can."""
    run_workers(
        record_cuda_sum, (tmp_path,), 2, signal.SIGTERM, preload=("tango_fairscale.train.loop",)
    )
    assert [(tmp_path / f"rank{r}").read_text() for r in range(2)] == ["6.0 True"] * 2


def record_settings_read_at_import(rank: int, directory: Path) -> None:
    import huggingface_hub.constants
    import tango.common.logging

    port = tango.common.logging._LOGGING_PORT
    offline = huggingface_hub.constants.HF_HUB_OFFLINE
    (directory / f"rank{rank}").write_text(f"{port} {offline}")


def test_workers_take_the_environment_of_the_call_not_of_the_server_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A setting the server's preloaded modules read at import follows the caller's environment:
    here Tango's log socket (as ``tango run`` sets it after the server may have started) and
    Hugging Face's offline flag."""
    monkeypatch.delenv("TANGO_LOGGING_PORT", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    run_workers(record_settings_read_at_import, (tmp_path,), 1, signal.SIGTERM)
    assert (tmp_path / "rank0").read_text() == "None False"

    monkeypatch.setenv("TANGO_LOGGING_PORT", "65000")  # nothing listens: records are dropped
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    run_workers(record_settings_read_at_import, (tmp_path,), 2, signal.SIGTERM)
    assert [(tmp_path / f"rank{r}").read_text() for r in range(2)] == ["65000 True"] * 2


def fail_on_rank_one(rank: int) -> None:
    if rank == 1:
        {}["missing key"]


def test_a_workers_error_is_one_line_and_keeps_its_traceback() -> None:
    """What the run's log shows under the one line (tests/test_terminal_errors.py)."""
    with pytest.raises(WorkerFailed) as error:
        run_workers(fail_on_rank_one, (), 2, signal.SIGTERM)
    assert str(error.value) == "training process 1 failed: KeyError: 'missing key'"
    cause = str(error.value.__cause__)
    assert "Traceback (most recent call last)" in cause and "in fail_on_rank_one" in cause


LAUNCHER = """
import signal, sys
sys.path.insert(0, {here!r})
from test_spawned_workers import write_pid_then_sleep
from tango_fairscale.runtime.spawn import WorkerFailed, run_workers
run_workers(write_pid_then_sleep, ({directory!r},), 2, signal.SIGTERM)
"""


def write_pid_then_sleep(rank: int, directory: str) -> None:
    partial = Path(directory) / f".rank{rank}"
    partial.write_text(str(os.getpid()))
    partial.rename(Path(directory) / f"rank{rank}")
    time.sleep(300)


def is_running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_workers_die_with_their_launcher(tmp_path: Path) -> None:
    """The launching process alone SIGKILLed (an out-of-memory kill, say): its workers exit within
    seconds instead of training on unsupervised beside a rerun."""
    code = LAUNCHER.format(here=str(Path(__file__).parent), directory=str(tmp_path))
    launcher = subprocess.Popen([sys.executable, "-c", code])
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("rank*"))) < 2:
            assert launcher.poll() is None and time.monotonic() < deadline, "no workers started"
            time.sleep(0.05)
        workers = [int(path.read_text()) for path in sorted(tmp_path.glob("rank*"))]
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 10
        while any(is_running(worker) for worker in workers):
            assert time.monotonic() < deadline, "the workers outlived their launcher"
            time.sleep(0.05)
    finally:
        for worker in workers:
            if is_running(worker):
                os.kill(worker, signal.SIGKILL)
