"""Graphed training steps (``parallel/graphs.py``): the static batch, loss and gradients equal
the model's own on packed PIQA batches, and a step that cannot be captured runs eagerly (CPU); on
a GPU the replayed steps follow the eager ones, the sharded engines train the bare model on one
GPU unless their wrapper does more than shard and checkpoint (checkpointed blocks replayed with
their dropout)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import engine_config
from tango.common import Lazy, Params
from tango.integrations.torch import Model, TrainConfig, TrainingEngine

from tango_fairscale.data.batches import training_batch
from tango_fairscale.data.queries import encode_pairs
from tango_fairscale.model.causal_lm import ModelWrapper
from tango_fairscale.parallel.graphs import (
    BUCKET_TOKENS,
    CaptureFailed,
    GraphedSteps,
    static_batch,
    static_loss,
)
from tango_fairscale.tasks.lm_eval import TaskSpec, load_tasks
from tango_fairscale.tasks.training_pairs import training_pairs

GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs run on GPUs")


@pytest.fixture(scope="module")
def packed_batches(piqa_small: Any, tiny_model_dir: Path) -> list[dict[str, torch.Tensor]]:
    """Packed training micro-batches of 8 PIQA examples, as the loop makes them."""
    model = ModelWrapper(str(tiny_model_dir))
    task = TaskSpec(name="piqa", dataset=piqa_small)
    pairs = training_pairs(load_tasks(task, training=True)["tasks"]["piqa"], "piqa")[:40]
    queries = encode_pairs(model.tokenizer, pairs, model.max_length)
    return [
        training_batch(queries[i : i + 8], model.pad_token_id, model.max_length, packed=True)
        for i in range(0, 40, 8)
    ]


def test_the_static_loss_is_the_models_loss(packed_batches, tiny_model_dir) -> None:
    model = ModelWrapper(str(tiny_model_dir)).eval()
    for batch in packed_batches:
        static = static_batch(batch, model.pad_token_id)
        length = static["input_ids"].shape[1]
        assert (
            length % BUCKET_TOKENS == 0 and length - BUCKET_TOKENS < batch["attention_mask"].sum()
        )
        assert static["token_weights"].sum().item() == pytest.approx(1.0)
        with torch.no_grad():
            expected = model(**batch)["loss"]
            assert static_loss(model, static).item() == pytest.approx(expected.item(), abs=1e-5)


def test_the_static_loss_has_the_models_gradients(packed_batches, tiny_model_dir) -> None:
    model = ModelWrapper(str(tiny_model_dir)).eval()

    def gradients(loss: torch.Tensor) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        loss.backward()
        return [p.grad.clone() for p in model.parameters()]

    batch = packed_batches[3]
    static = static_batch(batch, model.pad_token_id)
    assert static["input_ids"].shape[1] > BUCKET_TOKENS  # the loss projects several chunks
    # GPT-2's head is its embedding: the static loss puts the head's gradient in its .grad and
    # the embedding's backward adds to it (a gradient there already, as in accumulation: kept).
    assert model.model.get_output_embeddings().weight is model.model.get_input_embeddings().weight
    ours = gradients(static_loss(model, static))
    theirs = gradients(model(**batch)["loss"])
    for (name, _), a, b in zip(model.named_parameters(), ours, theirs, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4, msg=name)
    model.zero_grad(set_to_none=True)
    static_loss(model, static).backward()
    static_loss(model, static).backward()  # onto the gradients already there
    for (name, parameter), a in zip(model.named_parameters(), ours, strict=True):
        torch.testing.assert_close(parameter.grad, 2 * a, atol=1e-6, rtol=1e-4, msg=name)


def test_packed_micro_batches_without_outputs_are_replayed(packed_batches) -> None:
    padded = {k: v for k, v in packed_batches[0].items() if k not in ("query_ids",)}
    assert GraphedSteps.takes(packed_batches[:1], keep_outputs=False)
    assert GraphedSteps.takes(packed_batches[:2], keep_outputs=False)  # accumulation
    assert not GraphedSteps.takes(packed_batches[:1], keep_outputs=True)  # callbacks' outputs
    assert not GraphedSteps.takes([padded], keep_outputs=False)
    assert not GraphedSteps.takes([packed_batches[0], padded], keep_outputs=False)


def build(
    engine: str, model_dir: Path, work_dir: Path, device: int | None = None, **params: Any
) -> Any:
    """``engine`` on the GPU where there is one (``device`` -1: on the CPU)."""
    if device is None:
        device = 0 if torch.cuda.is_available() else -1
    config = TrainConfig("graphs", work_dir, devices=[device], world_size=1, is_distributed=False)
    model = Lazy(Model, Params({"type": "tango_fairscale::causal_lm", "model": str(model_dir)}))
    return Lazy(TrainingEngine, Params(engine_config(engine, **params))).construct(
        train_config=config, model=model
    )


def losses(engine: Any, batches: list, steps: int, micro_batches: int = 1) -> list[float]:
    """The losses of ``steps`` steps, each of ``micro_batches`` of ``batches`` in turn."""
    from tango_fairscale.train.loop import forward_backward

    found = []
    for step in range(steps):
        first = step * micro_batches
        step_batches = [batches[(first + i) % len(batches)] for i in range(micro_batches)]
        loss, _ = forward_backward(engine, step_batches)
        engine.step()
        found.append(loss.item())
    return found


def test_a_step_that_cannot_be_captured_runs_eagerly(
    packed_batches, tiny_model_dir, tmp_path, caplog
) -> None:
    """Graphs whose capture fails (a stand-in, on the CPU: bitwise comparable) leave that step
    and every later one to the eager loop, with one warning."""
    from tango_fairscale.train.loop import forward_backward

    class Uncapturable:
        takes = staticmethod(GraphedSteps.takes)

        def forward_backward(self, batches: list) -> torch.Tensor:
            raise CaptureFailed("operation not permitted when stream is capturing")

    engine = build("tango_fairscale::ddp", tiny_model_dir, tmp_path / "f", device=-1)
    reference = build("tango_fairscale::ddp", tiny_model_dir, tmp_path / "r", device=-1)
    engine.graphs = Uncapturable()
    with caplog.at_level(logging.WARNING):
        loss, _ = forward_backward(engine, packed_batches[:2])
    assert engine.graphs is None and "cannot be captured as a CUDA graph" in caplog.text
    expected, _ = forward_backward(reference, packed_batches[:2])
    assert loss.item() == expected.item()
    for ours, theirs in zip(engine.model.parameters(), reference.model.parameters(), strict=True):
        assert torch.equal(ours.grad, theirs.grad)


@GPU
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_replayed_steps_follow_the_eager_steps(
    precision, packed_batches, tiny_model_dir, tmp_path
) -> None:
    graphed = build("tango_fairscale::ddp", tiny_model_dir, tmp_path / "g", precision=precision)
    eager = build("tango_fairscale::ddp", tiny_model_dir, tmp_path / "e", precision=precision)
    assert graphed.graphs is not None
    eager.graphs = None
    replayed, reference = losses(graphed, packed_batches, 20), losses(eager, packed_batches, 20)
    tolerance = 1e-4 if precision == "32-true" else 2e-2
    assert max(abs(a - b) for a, b in zip(replayed, reference)) < tolerance, (replayed, reference)
    assert replayed[-1] < replayed[0]  # it trains
    assert graphed.graphs.graphs  # captured, one graph per length met


@GPU
def test_replayed_accumulation_follows_the_eager_steps(
    packed_batches, tiny_model_dir, tmp_path
) -> None:
    """Two micro-batches a step (the second step's second meets a new length, captured before
    that step's first replay): the losses and the trained weights follow the eager loop's."""
    graphed = build("tango_fairscale::ddp", tiny_model_dir, tmp_path / "g", precision="32-true")
    eager = build("tango_fairscale::ddp", tiny_model_dir, tmp_path / "e", precision="32-true")
    eager.graphs = None
    replayed = losses(graphed, packed_batches, 10, micro_batches=2)
    reference = losses(eager, packed_batches, 10, micro_batches=2)
    assert max(abs(a - b) for a, b in zip(replayed, reference)) < 1e-4, (replayed, reference)
    for (name, ours), theirs in zip(
        graphed.model.named_parameters(), eager.model.parameters(), strict=True
    ):
        assert torch.allclose(ours, theirs, atol=1e-4), name
    assert len(graphed.graphs.graphs) > 1  # 512 and 768 tokens


@GPU
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_updates_inside_the_replayed_backward_train_as_the_step_after_it(
    precision, packed_batches, tiny_model_dir, tmp_path
) -> None:
    """Without clipping, a fused AdamW updates each parameter inside the graph's backward and
    holds no gradient after it. Three engines take the first step alike (eager, updates in the
    backward: the optimizer's state is made outside any graph); then one replays graphs that
    update inside, two replay graphs whose step follows the backward, through a warmup schedule
    and a weight decay changed mid-run (new graphs). The GPU's own run-to-run noise (atomic
    sums: two runs of one path differ) bounds how far the graphed updates may be from the
    step after the backward; a learning rate baked into a graph would be thousands of times
    farther."""
    from tango_fairscale.train.loop import forward_backward

    settings = {
        "precision": precision,
        "max_grad_norm": None,
        "optimizer": {"type": "torch::AdamW", "lr": 1e-3, "weight_decay": 0.1},
        "lr_scheduler": {"type": "tango_fairscale::warmup", "warmup_steps": 3},
    }
    engines = [
        build("tango_fairscale::ddp", tiny_model_dir, tmp_path / n, **settings) for n in "iat"
    ]
    inside, after, twin = engines
    assert all(engine.graphs.backward_step is not None for engine in engines)
    found: list[list[float]] = [[], [], []]
    for step in range(10):
        if step == 6:
            for engine in engines:
                engine.optimizer.param_groups[0]["weight_decay"] = 0.05
        for engine, engine_losses in zip(engines, found, strict=True):
            loss, _ = forward_backward(engine, [packed_batches[step % len(packed_batches)]])
            engine.step()
            engine_losses.append(loss.item())
        for engine in (after, twin):  # from the second step: the step after the backward
            engine.graphs.backward_step = None

    def gap(a: Any, b: Any) -> float:
        pairs = zip(a.model.parameters(), b.model.parameters(), strict=True)
        return max((x - y).abs().mean().item() for x, y in pairs)

    noise, apart = gap(after, twin), gap(inside, after)
    assert apart <= 4 * noise + 1e-8, (apart, noise)
    losses_apart = max(abs(x - y) for x, y in zip(found[0], found[1]))
    losses_noise = max(abs(x - y) for x, y in zip(found[1], found[2]))
    assert losses_apart <= 4 * losses_noise + 1e-6, (found, losses_apart, losses_noise)
    assert all(p.grad is None for p in inside.model.parameters())
    assert inside.graphs.graphs and found[0][-1] < found[0][0]


@GPU
def test_a_sharded_engine_trains_the_bare_model_on_one_gpu(tiny_model_dir, tmp_path) -> None:
    import torch.distributed as dist

    from tango_fairscale.parallel.strategy import OneDeviceStrategy

    try:
        bare = build("tango_fairscale::fairscale", tiny_model_dir, tmp_path / "a")
        assert isinstance(bare.strategy, OneDeviceStrategy) and bare.graphs is not None
        offloaded = build(
            "tango_fairscale::fairscale",
            tiny_model_dir,
            tmp_path / "b",
            sharding={"cpu_offload": True},
        )
        assert offloaded.strategy.sharded and offloaded.graphs is None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@GPU
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_checkpointed_blocks_are_replayed_with_the_forwards_dropout(
    precision, packed_batches, tokenizer_dir, tmp_path
) -> None:
    """On one GPU, FairScale with activation checkpointing trains the bare model, its blocks under
    torch's checkpoint, from CUDA graphs; with dropout on, the recomputation inside the graph
    draws the forward's masks, with the forward's attention kernels (bf16: the efficient kernel,
    not cuDNN's): its losses and weights are the plain replayed steps'."""
    from conftest import save_tiny_gpt2

    from tango_fairscale.parallel.strategy import OneDeviceStrategy

    dropout = {"resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1}
    model_dir = save_tiny_gpt2(tmp_path / "model", tokenizer_dir, **dropout)
    sharding = {"activation_checkpointing": True}
    checkpointed = build(
        "tango_fairscale::fairscale",
        model_dir,
        tmp_path / "c",
        precision=precision,
        sharding=sharding,
    )
    plain = build("tango_fairscale::ddp", model_dir, tmp_path / "p", precision=precision)
    assert isinstance(checkpointed.strategy, OneDeviceStrategy)
    assert checkpointed.graphs is not None and plain.graphs is not None
    found = []
    for engine in (checkpointed, plain):
        torch.cuda.manual_seed(0)
        found.append(losses(engine, packed_batches, 10))
    assert checkpointed.graphs.graphs  # captured, not left to the eager loop
    tolerance = 1e-5 if precision == "32-true" else 2e-2  # as the eager bf16 steps follow
    assert max(abs(a - b) for a, b in zip(*found)) < tolerance, found
    if precision == "32-true":
        for (name, ours), theirs in zip(
            checkpointed.model.named_parameters(), plain.model.parameters(), strict=True
        ):
            torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5, msg=name)


@GPU
def test_graphs_are_captured_while_another_thread_pins_host_memory(
    packed_batches, tiny_model_dir, tmp_path
) -> None:
    """The checkpoint writer pins its host memory on a thread while steps go on (and captures
    happen at any new length): another thread's CUDA calls must not break a capture."""
    import threading

    from tango_fairscale.parallel.host_copy import HostCopier

    engine = build("tango_fairscale::ddp", tiny_model_dir, tmp_path / "g")
    stop = threading.Event()

    def pin_again_and_again() -> None:
        copier = HostCopier()
        size = 1 << 20
        while not stop.is_set():
            copier.reserve(size)
            size *= 2 if size < 1 << 26 else 1
            copier.release()

    pinning = threading.Thread(target=pin_again_and_again)
    pinning.start()
    try:
        losses(engine, packed_batches, 10)
    finally:
        stop.set()
        pinning.join()
    assert engine.graphs is not None and engine.graphs.graphs  # captured


@GPU
def test_the_bare_models_probes_run_on_its_gpu(tiny_model_dir, tmp_path, probed_devices) -> None:
    import torch.distributed as dist

    try:
        build("tango_fairscale::fairscale", tiny_model_dir, tmp_path / "a")
        build("tango_fairscale::ddp", tiny_model_dir, tmp_path / "b", precision="bf16-true")
        build("tango_fairscale::fairscale", tiny_model_dir, tmp_path / "c", device=-1)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    assert probed_devices == ["cuda", "cpu", "cpu"]  # bf16-true: cast on the CPU first, as before
