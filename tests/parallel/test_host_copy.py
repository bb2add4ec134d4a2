"""Host copies of an engine's state (``parallel/host_copy.py``): the copy keeps the state's
nesting, owns its tensors (later updates do not reach it), keeps tied tensors tied, and needs no
event without device tensors; the tensors it stages share one block, reused from copy to copy,
reserved ahead, and, given up, kept only as long as a copy taken from it. On the CPU the block
stages CPU tensors (``device_type="cpu"``); pinning and the CUDA event are checked on a GPU."""

from __future__ import annotations

import io
from collections import OrderedDict, namedtuple
from dataclasses import dataclass

import pytest
import torch

from tango_fairscale.parallel.host_copy import ALIGNMENT, HostCopier

Pair = namedtuple("Pair", "first second")


@dataclass(frozen=True)
class Snapshot:
    """A format's snapshot as a dataclass (DCP's is one): its fields are copied like the rest."""

    state: dict
    label: str


BOTH_KINDS = pytest.mark.parametrize("staged", [False, True], ids=["cloned", "staged"])


def copier_for(staged: bool) -> HostCopier:
    """A copier that stages the CPU tensors of these tests in its block, or clones them."""
    return HostCopier("cpu" if staged else "cuda")


@BOTH_KINDS
def test_the_copy_keeps_the_nesting_and_owns_its_tensors(staged: bool) -> None:
    weight = torch.arange(6.0, requires_grad=True)
    state = {
        "model": OrderedDict(weight=weight),
        "optimizer": {"state": [(torch.ones(2), 3)], "lr": 0.1},
        "pair": Pair(torch.zeros(1), "x"),
        "step": 7,
    }
    copied, event = copier_for(staged).copy(state)
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


def test_a_dataclass_is_copied_field_by_field_into_the_block() -> None:
    weight = torch.arange(4.0)
    snapshot = Snapshot({"weight": weight, "step": 2}, "of step 2")
    copier = HostCopier("cpu")
    assert copier.size(snapshot) == weight.numel() * weight.element_size()
    copied, _ = copier.copy(snapshot)
    assert type(copied) is Snapshot and copied.label == "of step 2"
    assert copied.state["step"] == 2 and torch.equal(copied.state["weight"], weight)
    weight.add_(1.0)
    assert torch.equal(copied.state["weight"], torch.arange(4.0))  # its own bytes, in the block
    assert copied.state["weight"].data_ptr() == copier._block.data_ptr()


@BOTH_KINDS
def test_tied_tensors_stay_tied_and_views_stay_apart(staged: bool) -> None:
    embedding = torch.randn(4, 3)
    state = {"wte": embedding, "lm_head": embedding, "row": embedding[1], "empty": torch.empty(0)}
    state["also_empty"] = torch.empty(0)
    copied, _ = copier_for(staged).copy(state)
    assert copied["wte"] is copied["lm_head"]  # one copy, shared
    assert copied["wte"] is not embedding
    assert torch.equal(copied["row"], embedding[1]) and copied["row"] is not copied["wte"]
    assert copied["empty"] is not copied["also_empty"]


@BOTH_KINDS
def test_each_copy_is_taken_afresh(staged: bool) -> None:
    copier = copier_for(staged)
    tensor = torch.zeros(3)
    first, _ = copier.copy({"t": tensor})
    assert torch.equal(first["t"], torch.zeros(3))  # read before the next copy (the contract)
    tensor.add_(2.0)
    second, _ = copier.copy({"t": tensor})
    assert torch.equal(second["t"], torch.full((3,), 2.0))


def test_staged_tensors_share_one_block_at_their_exact_size() -> None:
    weight = torch.randn(5, 3)
    state = {
        "empty": torch.empty(0, 4),
        "weight": weight,
        "transposed": weight.t(),  # another view of the same memory: a copy of its own
        "tied": weight,
        "half": torch.randn(7, dtype=torch.bfloat16),
        "steps": torch.tensor(12, dtype=torch.int64),
    }
    copier = HostCopier("cpu")
    assert copier.size(state) == 3 * ALIGNMENT + 8  # each copy starts aligned; empties cloned
    copied, _ = copier.copy(state)
    block = copier._block
    assert block is not None and block.numel() == copier.size(state)
    starts = []
    for key in ("weight", "transposed", "half", "steps"):
        assert torch.equal(copied[key], state[key]) and copied[key].dtype == state[key].dtype
        starts.append(copied[key].data_ptr() - block.data_ptr())
        # in the block, each tensor a storage of its own: torch.save writes its bytes only
        assert copied[key].untyped_storage().nbytes() == state[key].nbytes
    assert starts == [0, ALIGNMENT, 2 * ALIGNMENT, 3 * ALIGNMENT]
    assert copied["tied"] is copied["weight"] and copied["transposed"].is_contiguous()
    assert copied["empty"].shape == (0, 4)
    saved = io.BytesIO()
    torch.save({"half": copied["half"]}, saved)
    assert len(saved.getvalue()) < 2_000  # not the whole block


def test_the_block_is_reserved_ahead_and_kept_for_smaller_copies() -> None:
    full = {"model": torch.randn(64), "optimizer": [torch.randn(64), torch.randn(64)]}
    copier = HostCopier("cpu")
    copier.reserve(copier.size(full))
    block = copier._block
    assert block is not None and block.numel() == copier.size(full)
    copier.copy(full)
    copied, _ = copier.copy({"model": full["model"]})  # a model-only final checkpoint
    assert copier._block is block and torch.equal(copied["model"], full["model"])
    copier.copy({**full, "more": torch.randn(8)})  # a larger state: a larger block
    assert copier._block is not block and copier._block.numel() == copier.size(
        {**full, "more": torch.randn(8)}
    )
    copier.release()
    assert copier._block is None


def test_a_released_block_lives_as_long_as_a_copy_taken_from_it() -> None:
    """A copy handed on (the final checkpoint's model) keeps its bytes after the copier released
    the block, and the block is freed once that copy is gone: the copier keeps none of it."""
    import gc
    import weakref

    model = {"weight": torch.randn(64), "bias": torch.randn(8)}
    copier = HostCopier("cpu")
    copied, _ = copier.copy(model)
    memory = weakref.ref(copier._bytes)  # the block's bytes, which every staged copy views
    copier.release()
    gc.collect()
    assert memory() is not None and torch.equal(copied["weight"], model["weight"])
    del copied
    gc.collect()
    assert memory() is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory and CUDA events")
def test_device_tensors_are_copied_into_pinned_memory_without_waiting() -> None:
    state = {"weight": torch.randn(1024, 1024, device="cuda"), "step": 3}
    copier = HostCopier()
    copier.reserve(copier.size(state))
    block = copier._block
    copied, event = copier.copy(state)
    assert event is not None and copier._block is block and copied["weight"].is_pinned()
    event.synchronize()
    assert torch.equal(copied["weight"], state["weight"].cpu()) and copied["step"] == 3
    # DCP's snapshot (a dataclass) likewise: into the pinned block, not cloned on the GPU.
    snapshot, done = copier.copy(Snapshot(state, "dcp"))
    assert done is not None and snapshot.state["weight"].is_pinned()
    done.synchronize()
    assert torch.equal(snapshot.state["weight"], state["weight"].cpu())
