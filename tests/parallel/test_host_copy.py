"""Host copies of an engine's state (``parallel/host_copy.py``), on the CPU: the copy keeps the
state's nesting, owns its tensors (later updates do not reach it), keeps tied tensors tied, and
needs no event without device tensors. (The pinned buffers and the CUDA event need a GPU.)"""

from __future__ import annotations

from collections import OrderedDict, namedtuple

import torch

from tango_fairscale.parallel.host_copy import HostCopier

Pair = namedtuple("Pair", "first second")


def test_the_copy_keeps_the_nesting_and_owns_its_tensors() -> None:
    weight = torch.arange(6.0, requires_grad=True)
    state = {
        "model": OrderedDict(weight=weight),
        "optimizer": {"state": [(torch.ones(2), 3)], "lr": 0.1},
        "pair": Pair(torch.zeros(1), "x"),
        "step": 7,
    }
    copied, event = HostCopier().copy(state)
    assert event is None  # nothing on a device
    assert type(copied["model"]) is OrderedDict and type(copied["optimizer"]["state"][0]) is tuple
    assert copied["step"] == 7 and copied["optimizer"]["lr"] == 0.1
    assert isinstance(copied["pair"], Pair) and copied["pair"].second == "x"
    assert (
        torch.equal(copied["model"]["weight"], weight)
        and not copied["model"]["weight"].requires_grad
    )
    with torch.no_grad():
        weight.add_(1.0)
        state["optimizer"]["state"][0][0].add_(1.0)
        state["pair"].first.add_(1.0)
    assert torch.equal(copied["model"]["weight"], torch.arange(6.0))  # not updated with the state
    assert torch.equal(copied["optimizer"]["state"][0][0], torch.ones(2))
    assert torch.equal(copied["pair"].first, torch.zeros(1))


def test_tied_tensors_stay_tied_and_views_stay_apart() -> None:
    embedding = torch.randn(4, 3)
    state = {"wte": embedding, "lm_head": embedding, "row": embedding[1], "empty": torch.empty(0)}
    state["also_empty"] = torch.empty(0)
    copied, _ = HostCopier().copy(state)
    assert copied["wte"] is copied["lm_head"]  # one copy, shared
    assert copied["wte"] is not embedding
    assert torch.equal(copied["row"], embedding[1]) and copied["row"] is not copied["wte"]
    assert copied["empty"] is not copied["also_empty"]


def test_each_copy_is_taken_afresh() -> None:
    copier = HostCopier()
    tensor = torch.zeros(3)
    first, _ = copier.copy({"t": tensor})
    tensor.add_(2.0)
    second, _ = copier.copy({"t": tensor})
    assert torch.equal(first["t"], torch.zeros(3)) and torch.equal(
        second["t"], torch.full((3,), 2.0)
    )
