"""Updates inside the backward (``parallel/backward_step.py``), on the CPU: each parameter's
update from its hook trains bit for bit as one step after the backward (a tied weight updated
once, two parameter groups, a scheduled learning rate, a loaded state dict), dropping frees
gradients without updating, and where it applies. The graphed form: ``test_graphs.py`` (GPU)."""

from __future__ import annotations

import copy

import pytest
import torch

from tango_fairscale.parallel import backward_step
from tango_fairscale.parallel.backward_step import BackwardStep


class TiedModel(torch.nn.Module):
    """An embedding whose weight is also the output projection's (used twice a forward)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(11, 6)
        self.hidden = torch.nn.Linear(6, 6)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.hidden(self.embed(ids)))
        logits = hidden @ self.embed.weight.T
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.roll(1).flatten())


def optimizer_of(model: torch.nn.Module, **settings) -> torch.optim.Optimizer:
    """AdamW over two groups, as trainers split them: weights decayed, biases not."""
    decayed = [p for name, p in model.named_parameters() if not name.endswith("bias")]
    plain = [p for name, p in model.named_parameters() if name.endswith("bias")]
    groups = [{"params": decayed, "weight_decay": 0.1}, {"params": plain, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=2**-6, **{"fused": True, **settings})


def batches(steps: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(0, 11, (3, 5), generator=generator) for _ in range(steps)]


@pytest.mark.parametrize("bucket_bytes", [1, 200, backward_step.BUCKET_BYTES])
def test_updates_in_the_backward_train_as_the_step_after_it(bucket_bytes, monkeypatch) -> None:
    """Buckets of one parameter, of a few (across both groups) and of all of them."""
    monkeypatch.setattr(backward_step, "BUCKET_BYTES", bucket_bytes)
    hooked, plain = TiedModel(), TiedModel()
    hooked_optimizer, plain_optimizer = optimizer_of(hooked), optimizer_of(plain)
    schedules = [
        torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: (step + 1) / 4)
        for optimizer in (hooked_optimizer, plain_optimizer)
    ]
    steps = BackwardStep(hooked_optimizer)
    for step, ids in enumerate(batches(6)):
        with steps.stepping():
            hooked(ids).backward()
            steps.flush()
        plain(ids).backward()
        plain_optimizer.step()
        plain_optimizer.zero_grad(set_to_none=True)
        for schedule in schedules:
            schedule.step()
        assert all(p.grad is None for p in hooked.parameters()), step
        for (name, ours), theirs in zip(hooked.named_parameters(), plain.parameters(), strict=True):
            assert torch.equal(ours, theirs), (step, name)
    # The tied weight was updated once a step: its step count is the model's.
    assert hooked_optimizer.state[hooked.embed.weight]["step"].item() == 6


def test_a_loaded_state_dict_is_followed() -> None:
    """Loading replaces the optimizer's group dicts: the updates read the loaded ones."""
    hooked, plain = TiedModel(), TiedModel()
    hooked_optimizer, plain_optimizer = optimizer_of(hooked), optimizer_of(plain)
    steps = BackwardStep(hooked_optimizer)
    ids = batches(1)[0]
    plain(ids).backward()
    plain_optimizer.step()
    plain_optimizer.zero_grad(set_to_none=True)
    plain_optimizer.param_groups[0]["lr"] = 2**-8
    hooked.load_state_dict(plain.state_dict())
    hooked_optimizer.load_state_dict(copy.deepcopy(plain_optimizer.state_dict()))  # not shared
    with steps.stepping():
        hooked(ids).backward()
        steps.flush()
    plain(ids).backward()
    plain_optimizer.step()
    for ours, theirs in zip(hooked.parameters(), plain.parameters(), strict=True):
        assert torch.equal(ours, theirs)


def test_dropping_frees_gradients_and_updates_nothing() -> None:
    model = TiedModel()
    optimizer = optimizer_of(model)
    steps = BackwardStep(optimizer)
    before = [p.detach().clone() for p in model.parameters()]
    ids = batches(1)[0]
    with steps.dropping():
        model(ids).backward()
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert not optimizer.state
    model(ids).backward()  # outside both: the usual backward, gradients kept
    assert all(p.grad is not None for p in model.parameters())
    assert steps.hyperparameters()[0]["weight_decay"] == 0.1
    assert all("lr" not in s and "params" not in s for s in steps.hyperparameters())


def test_a_first_update_is_not_captured() -> None:
    """Optimizer state made inside a CUDA graph's capture would live in the graph's memory: a
    parameter without state is refused there (the graphed step then runs eagerly)."""
    model = TiedModel()
    steps = BackwardStep(optimizer_of(model))
    with pytest.raises(RuntimeError, match="first update cannot be captured"):
        with steps.stepping(lr_tensors=True):
            model(batches(1)[0]).backward()
            steps.flush()


def test_a_bucket_left_unflushed_is_refused() -> None:
    model = TiedModel()
    steps = BackwardStep(optimizer_of(model))
    with pytest.raises(RuntimeError, match="not flushed"), steps.stepping():
        model(batches(1)[0]).backward()
    with steps.stepping():  # the refused bucket was emptied
        steps.flush()


@pytest.mark.parametrize(
    ("settings", "clips", "grad_accum", "expected"),
    [
        ({}, False, 1, True),
        ({"fused": False}, False, 1, False),  # per-tensor: a graph would bake in its lr
        ({}, True, 1, False),  # clipping needs every gradient first
        ({}, False, 2, False),  # accumulation needs the summed gradients
    ],
)
def test_where_updates_in_the_backward_apply(settings, clips, grad_accum, expected) -> None:
    optimizer = optimizer_of(TiedModel(), **settings)
    assert BackwardStep.applies(optimizer, clips, grad_accum) is expected
    sgd = torch.optim.SGD(TiedModel().parameters(), lr=0.1)
    assert not BackwardStep.applies(sgd, False, 1)


def test_a_scheduler_that_moves_adams_betas_keeps_the_step_after_the_backward() -> None:
    """A graph holds every setting but the learning rate: one that moves every step would
    call for new graphs every step."""
    optimizer = optimizer_of(TiedModel())
    cycling = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.01, total_steps=10)
    assert not BackwardStep.applies(optimizer, False, 1, cycling)
    optimizer = optimizer_of(TiedModel())
    plain = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=0.01, total_steps=10, cycle_momentum=False
    )
    assert BackwardStep.applies(optimizer, False, 1, plain)
    assert BackwardStep.applies(optimizer, False, 1, None)
