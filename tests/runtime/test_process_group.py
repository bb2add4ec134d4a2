"""The process group's helpers: a group of one runs no collective (alone they change nothing, and
on a GPU the first one would start NCCL's communicator, seconds that FairScale alone never
needs); without a group they answer as if alone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from tango_fairscale.compat import fairscale as fairscale_fixes
from tango_fairscale.evaluation.call import agree_max
from tango_fairscale.runtime.process_group import all_gather_objects, alone, barrier
from tango_fairscale.train.guards import any_rank
from tango_fairscale.train.run import _reduce_over_ranks

COLLECTIVES = ("barrier", "all_reduce", "all_gather", "all_gather_object", "broadcast")


@pytest.fixture
def group_of_one(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A gloo group of one process whose collectives fail the test if called."""
    dist.init_process_group("gloo", store=dist.HashStore(), world_size=1, rank=0)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a collective ran in a group of one")

    for name in COLLECTIVES:
        monkeypatch.setattr(dist, name, refuse)
    try:
        yield
    finally:
        monkeypatch.undo()
        dist.destroy_process_group()


def test_a_group_of_one_runs_no_collective(group_of_one: None) -> None:
    assert alone()
    barrier()
    assert all_gather_objects({"a": 1}) == [{"a": 1}]
    assert any_rank(True, torch.device("cpu")) and not any_rank(False, torch.device("cpu"))
    assert agree_max(3, torch.device("cpu")) == 3
    assert _reduce_over_ranks(torch.tensor(2.5), 7) == (2.5, 7)
    model = torch.nn.Linear(3, 2)
    model(torch.ones(4, 3)).sum().backward()
    before = torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item()
    assert before > 0.1
    assert fairscale_fixes.clip_grad_norm_(model, 0.1).item() == pytest.approx(before)
    after = torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item()
    assert after == pytest.approx(0.1, rel=1e-4)


def test_without_a_group_the_helpers_answer_as_alone() -> None:
    assert not dist.is_initialized()
    assert alone()
    barrier()
    assert all_gather_objects(5) == [5]
    assert any_rank(True, torch.device("cpu"))
