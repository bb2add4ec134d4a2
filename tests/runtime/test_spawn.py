"""Workers (``runtime.spawn.run_workers``) share the machine's cores and can use its GPU."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch

from tango_fairscale.runtime.spawn import run_workers


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
