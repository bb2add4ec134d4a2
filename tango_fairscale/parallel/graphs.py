"""A training step's forward and backward captured as a CUDA graph per token bucket and replayed.

On one GPU, short steps are bound by the host launching their kernels, not by the GPU: GPT-2 124M
on PIQA batches of 16 spends ~31 ms of Python and launches for ~7 ms of kernels a step. A graph
replay launches them all at once: the main job's steps take 9.8 ms (``docs/PERFORMANCE.md``), the
300-step loss curve within 0.001 of the eager one (``graph_probe_h200_ab52448.md``).

A graph needs static shapes and no host reads. A packed micro-batch's tokens become one row,
padded up to a multiple of :data:`BUCKET_TOKENS` (the main job's 2,000 steps meet 5 lengths); its
loss, the mean over queries of each query's mean token nll, is computed over every position with
per-token weights (0 for contexts and padding) instead of picking the scored positions, whose
count the host would read; the model's chunked loss computes its gradients in the forward, so no
logits are kept for the backward, and projects :data:`BUCKET_TOKENS` positions at a time (a
whole row's logits at once held ~10 bytes per token and vocabulary entry). The graph holds the
forward and the backward into gradient tensors that stay allocated and accumulate (a step of
several micro-batches replays one graph each, its gradients zeroed first); clipping and the
optimizer step run after it as usual (a fused AdamW is one launch) — or, where the update can
run inside the backward (:mod:`.backward_step`: a fused Adam, no clipping, one micro-batch), the
graph holds each parameter's update and no gradient outlives it. Each length is captured the
first time a step meets it, after a few warm-up passes on a side stream; dropout draws from the
graph-safe CUDA generator.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from ..data.batches import IGNORE_INDEX
from ..model.causal_lm import ModelWrapper
from ..model.loss import weighted_nll_sum
from ..runtime.devices import pinned_for
from .backward_step import BackwardStep
from .precision import Precision

#: A graphed step's row is padded up to a multiple of this many tokens (one graph per length).
BUCKET_TOKENS = 256
#: Forward and backward passes run on the side stream before a length is captured (lazy
#: initialisations, the allocator's pools).
WARMUP_PASSES = 3


def static_batch(batch: dict[str, torch.Tensor], pad_token_id: int) -> dict[str, torch.Tensor]:
    """The real tokens of packed ``batch`` (:func:`~tango_fairscale.data.batches.packed_batch`)
    as one row padded to a multiple of :data:`BUCKET_TOKENS`, with ``token_weights``: a scored
    token weighs ``1 / (its query's scored tokens × queries)``, so that the weighted sum of token
    nlls is :meth:`ModelWrapper.forward`'s loss. Padding: its own segment, unscored, weight 0."""
    keep = batch["attention_mask"].bool()
    flat = {key: batch[key][keep] for key in ("input_ids", "labels", "position_ids", "query_ids")}
    scored = flat["labels"] != IGNORE_INDEX
    num_queries = int(batch["query_ids"].max()) + 1
    owners = flat["query_ids"][scored]
    counts = torch.bincount(owners, minlength=num_queries).clamp(min=1).float()
    flat["token_weights"] = torch.zeros(len(scored))
    flat["token_weights"][scored] = 1.0 / counts[owners] / num_queries
    padding = -len(scored) % BUCKET_TOKENS
    fill: dict[str, float] = {"input_ids": pad_token_id, "labels": IGNORE_INDEX, "query_ids": -1}
    fill |= {"position_ids": 0, "token_weights": 0.0}
    return {
        key: torch.cat([value, value.new_full((padding,), fill[key])])[None]
        for key, value in flat.items()
    }


def static_loss(model: ModelWrapper, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The loss of a :func:`static_batch` on the device: shapes fixed by its length, no host
    reads (logits of every position, scored or not)."""
    hidden = model.packed_hidden(batch["input_ids"], batch["position_ids"], batch["query_ids"])
    head = model.model.get_output_embeddings()
    embedding = model.model.get_input_embeddings()
    return weighted_nll_sum(
        head,
        hidden.flatten(0, 1),
        batch["labels"].flatten(),
        batch["token_weights"].flatten(),
        model.logit_transform,
        chunk_rows=BUCKET_TOKENS,  # every length is a multiple: full chunks, small logits
        tied_head=head.weight is embedding.weight,
    )


class CaptureFailed(RuntimeError):
    """A length's step could not be captured: the model's forward or backward does something a
    CUDA graph cannot hold (reads a value to the host, say). The loop then steps eagerly."""


class GraphedSteps:
    """Forward and backward of ``model`` (bare, on one GPU) replayed from one CUDA graph per
    bucket length, under ``precision``'s autocast (without its cache of cast weights); with
    ``backward_step``, each parameter's optimizer update too."""

    def __init__(
        self, model: ModelWrapper, precision: Precision, backward_step: BackwardStep | None = None
    ) -> None:
        self.model = model
        self.precision = precision
        self.backward_step = backward_step
        #: Whether the last :meth:`forward_backward` updated the parameters (the engine's step
        #: then only moves the learning rate on).
        self.stepped = False
        self._updated_eagerly = False
        self._captured_settings: list[dict[str, Any]] | None = None
        self.device = next(model.parameters()).device
        self.parameters = [p for p in model.parameters() if p.requires_grad]
        self.loss = torch.zeros((), device=self.device)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, dict[str, torch.Tensor]]] = {}
        self.stream = torch.cuda.Stream(self.device)
        # Every length's graph allocates from this one pool: a graph's intermediates are dead
        # once its replay ends (its inputs, its loss and the gradients are tensors allocated
        # before any capture), and replays never overlap, so the lengths share the largest
        # graph's memory instead of holding their sum.
        self.pool = torch.cuda.graph_pool_handle()

    @staticmethod
    def takes(batches: list[dict[str, Any]], keep_outputs: bool) -> bool:
        """Whether a step of ``batches`` can be replayed: packed micro-batches, and only the
        loss wanted (callbacks that read a step's outputs get eager steps)."""
        return all("query_ids" in batch for batch in batches) and not keep_outputs

    def forward_backward(self, batches: list[dict[str, torch.Tensor]]) -> torch.Tensor:
        """One step's forward and backward over its micro-batches, as the eager loop runs them:
        the gradients zeroed, then each micro-batch's (its loss divided by their number)
        accumulated; the step's loss, a new tensor. A length met for the first time is captured
        before the step's first replay, so that no capture disturbs accumulated gradients."""
        hosts = [static_batch(batch, self.model.pad_token_id) for batch in batches]
        if self.backward_step is not None:
            if len(hosts) > 1:
                raise ValueError("updates inside the backward take one micro-batch a step")
            return self._step_in_backward(hosts[0], self.backward_step)
        for host in hosts:
            host["token_weights"] /= len(batches)
            self._captured(host)
        torch._foreach_zero_([p.grad for p in self.parameters if p.grad is not None])
        step_loss = torch.zeros((), device=self.device)
        for host in hosts:
            self._replay(host)
            step_loss += self.loss
        return step_loss

    def _step_in_backward(self, host: dict[str, torch.Tensor], steps: BackwardStep) -> torch.Tensor:
        """One step of one micro-batch whose backward updates the parameters: the first eager
        (the optimizer's state is made by a parameter's first update, outside any graph), the
        others replayed; new graphs where the optimizer's settings other than the learning rate
        changed since the capture (a graph holds them)."""
        if not self._updated_eagerly:
            with steps.stepping():
                self._pass({key: value.to(self.device) for key, value in host.items()})
            self.stepped = self._updated_eagerly = True
            return self.loss.clone()
        settings = steps.hyperparameters()
        if settings != self._captured_settings:
            self.graphs.clear()
            self._captured_settings = settings
        self._captured(host)
        steps.fill_learning_rates()
        self._replay(host)
        self.stepped = True
        return self.loss.clone()

    def _captured(self, host: dict[str, torch.Tensor]) -> None:
        """Capture the graph of ``host``'s length if none has been yet."""
        length = host["input_ids"].shape[1]
        if length not in self.graphs:
            self.graphs[length] = self._capture(host)

    def _replay(self, host: dict[str, torch.Tensor]) -> None:
        """``host``'s inputs copied into its length's graph, then the graph replayed."""
        graph, inputs = self.graphs[host["input_ids"].shape[1]]
        for key, value in host.items():
            inputs[key].copy_(pinned_for(value, self.device), non_blocking=True)
        graph.replay()

    def _pass(self, inputs: dict[str, torch.Tensor]) -> None:
        """Forward and backward, the gradients accumulated into (a graph zeroes none)."""
        with self.precision.forward_context(self.device, cache_weights=False):
            loss = static_loss(self.model, inputs)
        with self.precision.attention_kernels(self.device):
            loss.backward()
        if self.backward_step is not None:
            self.backward_step.flush()  # the last bucket's update (a no-op unless stepping)
        self.loss.copy_(loss.detach())

    def _capture(
        self, host: dict[str, torch.Tensor]
    ) -> tuple[torch.cuda.CUDAGraph, dict[str, torch.Tensor]]:
        """The graph of one length, its input tensors filled with ``host``; the gradients are
        left zero (the warm-up passes' and the capture's are cleared), or none are kept where
        the graph updates inside the backward (the warm-up passes drop theirs)."""
        inputs = {key: value.to(self.device) for key, value in host.items()}
        steps = self.backward_step
        if steps is None:
            for parameter in self.parameters:
                if parameter.grad is None:  # allocated outside any graph's pool, kept
                    parameter.grad = torch.zeros_like(parameter)
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        dropped = steps.dropping() if steps else contextlib.nullcontext()
        with torch.cuda.stream(self.stream), dropped:
            for _ in range(WARMUP_PASSES):
                self._pass(inputs)
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        graph = torch.cuda.CUDAGraph()
        updates = steps.stepping(lr_tensors=True) if steps else contextlib.nullcontext()
        # Threads of the checkpoint writer call CUDA meanwhile (pinning host memory, waiting
        # for a copy): only this thread's calls must not interrupt the capture.
        try:
            with (
                updates,
                torch.cuda.graph(
                    graph, pool=self.pool, stream=self.stream, capture_error_mode="thread_local"
                ),
            ):
                self._pass(inputs)
        except RuntimeError as error:  # the warm-up passes ran: the step itself works eagerly
            raise CaptureFailed(str(error).strip().splitlines()[0]) from error
        if steps is None:
            with torch.no_grad():
                for parameter in self.parameters:
                    assert parameter.grad is not None
                    parameter.grad.zero_()
        return graph, inputs
