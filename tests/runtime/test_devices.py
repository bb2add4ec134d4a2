"""Each training process's device (``runtime/devices.py``): GPUs by index, the CPU without one, the
launcher's own device under ``python -m tango_fairscale run``, one-line refusals of a
``device_count`` the machine or the launcher cannot give, and CUDA started on a thread."""

from __future__ import annotations

import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest
import torch
from tango.common.exceptions import ConfigurationError

from tango_fairscale.runtime import launcher
from tango_fairscale.runtime.devices import job_devices, start_cuda
from tango_fairscale.runtime.launcher import LAUNCH_VARIABLES, LaunchEnvironment


@pytest.fixture(autouse=True)
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(launcher, "_current", None)


def gpus(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    """The machine shows ``count`` GPUs (none: a CPU-only machine)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def test_without_a_gpu_every_process_uses_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus(monkeypatch, 0)
    assert job_devices(3) == [-1, -1, -1]


def test_each_process_gets_its_own_gpu_and_no_more_than_there_are(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gpus(monkeypatch, 2)
    assert job_devices(1) == [0]
    assert job_devices(2) == [0, 1]
    with pytest.raises(ConfigurationError, match="device_count 3 exceeds the 2 visible GPUs"):
        job_devices(3)


def test_plain_tango_run_under_a_launcher_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus(monkeypatch, 0)
    environment = {"RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    for name, value in {**environment, "WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(name, value)
    assert job_devices(1) == [-1]  # a job of one process: nobody else to meet
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigurationError, match="one of 2 started by a launcher") as error:
        job_devices(2)
    assert "python -m tango_fairscale run" in str(error.value)


def launched(monkeypatch: pytest.MonkeyPatch, world_size: int, local_rank: int) -> None:
    """This process is rank ``local_rank`` of a launched job of ``world_size`` on one node."""
    environment = LaunchEnvironment(
        local_rank, world_size, local_rank, world_size, "127.0.0.1", 29500, 0
    )
    monkeypatch.setattr(launcher, "_current", SimpleNamespace(environment=environment))


def test_under_the_launcher_each_process_lists_its_own_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gpus(monkeypatch, 2)
    launched(monkeypatch, world_size=2, local_rank=1)
    assert job_devices(2) == [1, 1]
    gpus(monkeypatch, 0)
    assert job_devices(2) == [-1, -1]


def test_a_device_count_other_than_the_launchers_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    launched(monkeypatch, world_size=2, local_rank=0)
    with pytest.raises(ConfigurationError) as error:
        job_devices(4)
    assert str(error.value) == (
        "device_count 4 disagrees with the launcher's 2 processes (WORLD_SIZE); "
        "set -D device_count=2"
    )


def test_starting_cuda_for_the_cpu_starts_no_thread() -> None:
    before = threading.active_count()
    start_cuda(torch.device("cpu"))
    assert threading.active_count() == before
    assert not any(thread.name == "cuda-start" for thread in threading.enumerate())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_started_on_a_thread_is_the_one_the_process_then_uses() -> None:
    # A fresh process: this one's CUDA may have started already.
    script = (
        "import torch, threading\n"
        "from tango_fairscale.runtime.devices import start_cuda\n"
        "start_cuda(torch.device('cuda'))\n"
        "starter = [t for t in threading.enumerate() if t.name == 'cuda-start']\n"
        "assert len(starter) == 1, starter\n"
        "x = torch.ones(4, device='cuda') * 2\n"  # waits for the thread's start, then runs
        "assert x.sum().item() == 8\n"
        "starter[0].join(30)\n"
        "assert torch.cuda.is_initialized() and not starter[0].is_alive()\n"
        "start_cuda(torch.device('cuda'))\n"  # started: no second thread
        "assert not [t for t in threading.enumerate() if t.name == 'cuda-start']\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "ok"
