"""The scored-position loss: the vocabulary projection and cross-entropy only where a token is
scored, in chunks, with the gradients computed in the forward (no logits stored)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from ..data.batches import IGNORE_INDEX
from ..runtime.devices import to_device
from .cross_entropy import chunk_cross_entropy, compiled_chunk_cross_entropy
from .projection import aligned_projection

#: Rows of logits computed at once (a 4096 × 50257 fp32 chunk is 0.8 GB).
LOGIT_CHUNK_ROWS = 4096
#: Training steps of this many tokens or more take the compiled loss on GPUs (fused passes over
#: the logits: eager, they cost ~10 % of a 124M step of 64 x 1,024 tokens on an H200); smaller
#: steps are host-bound, where fusion gains nothing and its first call cost 3.2 s.
COMPILED_LOSS_MIN_ROWS = LOGIT_CHUNK_ROWS


@dataclass(frozen=True)
class LogitTransform:
    """What a model's own forward does to ``lm_head(hidden)`` before the softmax: multiply by
    ``scale`` (Cohere's ``logit_scale``; Granite's ``1 / logits_scaling``), then cap softly
    (Gemma-2/3's ``final_logit_softcapping``: ``cap * tanh(logits / cap)``)."""

    scale: float = 1.0
    softcap: float | None = None

    @property
    def identity(self) -> bool:
        return self.scale == 1.0 and self.softcap is None

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        if self.scale != 1.0:
            logits = logits * self.scale
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


IDENTITY = LogitTransform()


def scored_row_nll(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    groups: torch.Tensor | None = None,
    num_groups: int | None = None,
    transform: LogitTransform = IDENTITY,
) -> tuple[torch.Tensor, ...]:
    """Each row's mean and summed cross-entropy over its scored targets, how many it has and,
    when scoring, whether each is the greedy (argmax) continuation.

    ``hidden`` ``(B, T, H)`` predicts ``targets`` ``(B, T)`` (``-100``: not scored) through
    ``transform(head(hidden))``. Returns ``(row_mean_nll, row_nll, num_tokens)``, each ``(B,)``,
    and, without gradients, ``row_greedy`` ``(B,)`` too; a row without scored targets has mean
    0. ``row_nll`` is float64: the fp32 per-token cross-entropies summed in float64
    (:func:`row_sums`), so that it does not depend on the batch the row is in. Only
    ``row_mean_nll`` carries gradients, and only for a loss that weighs every row alike
    (a multiple of ``row_mean_nll.sum()``, such as :func:`loss_outputs`' mean). With ``groups``
    ``(B, T)`` (packed rows), the "rows" are instead the ``num_groups`` values it holds at the
    scored positions.

    The vocabulary projection runs only where a token is scored, ``LOGIT_CHUNK_ROWS`` rows of
    logits at a time, and (see :class:`_ScoredCrossEntropy`) its gradients are computed with the
    forward, so that neither all logits (fp32 logits of 16 × 1024 GPT-2 tokens: 3.3 GB) nor a
    second projection in the backward pass are needed.
    """
    # Labels left on the CPU (as the scoring step leaves them) make picking the scored positions
    # free; on the device it waits for the device once (the count of positions sets the shapes).
    device = hidden.device
    scored = targets != IGNORE_INDEX
    positions = scored.flatten().nonzero()[:, 0]
    if groups is None:
        num_tokens = scored.sum(dim=1)
        rows = positions // targets.shape[1]
    else:
        assert num_groups is not None
        rows = groups.flatten().index_select(0, positions.to(groups.device)).to(positions.device)
        num_tokens = torch.bincount(rows, minlength=num_groups)
    token_weights = (1.0 / num_tokens.clamp(min=1).float()).index_select(0, rows)
    weight, bias = head_parameters(head)
    tokens = ScoredTokens(
        to_device(targets.flatten().index_select(0, positions), device),
        to_device(token_weights, device),
        to_device(rows, device),
        len(num_tokens),
    )
    picked = hidden.flatten(0, 1).index_select(0, to_device(positions, device))
    inputs = (picked, weight, bias, tokens, transform, LOGIT_CHUNK_ROWS)
    num_tokens = to_device(num_tokens, device)
    trains = (
        hidden.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    )
    if torch.is_grad_enabled() and trains:
        row_mean_nll, row_nll = _ScoredCrossEntropy.apply(*inputs)
        return row_mean_nll, row_nll, num_tokens
    row_mean_nll, row_nll, row_greedy = _score(*inputs)
    return row_mean_nll, row_nll, num_tokens, row_greedy


def weighted_nll_sum(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    token_weights: torch.Tensor,
    transform: LogitTransform = IDENTITY,
    chunk_rows: int = LOGIT_CHUNK_ROWS,
    tied_head: bool = False,
) -> torch.Tensor:
    """``sum(token_weights * nll)`` over every position of ``hidden`` ``(N, H)`` against
    ``targets`` ``(N,)`` (``-100`` where the weight is 0), through :class:`_ScoredCrossEntropy`
    ``chunk_rows`` positions at a time: static shapes and no host reads (a CUDA graph can hold
    it), gradients computed in the forward, so no logits are kept for the backward.

    ``tied_head`` (the head's weight is the input embedding's, whose backward comes later): the
    backward adds the head's weight gradient to the weight's ``.grad`` itself, and the
    embedding's gradient is then added to it in place; autograd would sum the two into a third
    ``(V, H)`` tensor (147 MiB at GPT-2's vocabulary in fp32)."""
    weight, bias = head_parameters(head)
    tokens = ScoredTokens(
        torch.where(targets == IGNORE_INDEX, 0, targets),  # weighs 0 there: any target serves
        token_weights,
        torch.zeros_like(targets),  # one row: the sum
        1,
    )
    total, _ = _ScoredCrossEntropy.apply(
        hidden, weight, bias, tokens, transform, chunk_rows, tied_head
    )
    return total[0]


def head_parameters(head: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The linear ``head``'s weight and bias (``None`` without one)."""
    weight, bias = head.weight, getattr(head, "bias", None)
    assert isinstance(weight, torch.Tensor)
    return weight, bias


def loss_outputs(
    row_mean_nll: torch.Tensor,
    row_nll: torch.Tensor,
    num_tokens: torch.Tensor,
    row_greedy: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """``forward``'s outputs from :func:`scored_row_nll`'s: ``loss``, ``loglikelihood``,
    ``num_tokens`` and, when scoring, ``greedy``."""
    outputs = {"loss": row_mean_nll.mean(), "loglikelihood": -row_nll, "num_tokens": num_tokens}
    if row_greedy is not None:
        outputs["greedy"] = row_greedy
    return outputs


def row_sums(token_nll: torch.Tensor, rows: torch.Tensor, num_rows: int) -> torch.Tensor:
    """Each row's sum of its fp32 ``token_nll`` in float64 (``(num_rows,)``, on the device).

    Exact to ~1e-12 at any magnitude, so a row's sum does not depend on the order its tokens are
    added in, nor on the rows beside it: a float32 sum of ~200 values near -2,000 is off by up
    to ~3e-4 (two float32 steps there), by an amount that changes with the order. Only the ``N``
    per-token values are converted, never the logits."""
    return token_nll.new_zeros(num_rows, dtype=torch.float64).index_add(0, rows, token_nll.double())


def _score(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    tokens: ScoredTokens,
    transform: LogitTransform,
    chunk_rows: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Without gradients: ``(row_mean_nll, row_nll, row_greedy)``, one log-softmax pass and one
    argmax per chunk of logits (fp32; on a GPU in low precision written so by the GEMM)."""
    device_type = hidden.device.type
    dtype = _compute_dtype(hidden)
    targets, token_weights, rows, num_rows = tokens
    n = hidden.shape[0]
    token_nll = torch.empty(n, dtype=torch.float32, device=hidden.device)
    token_missed = torch.empty(n, dtype=torch.float32, device=hidden.device)
    with torch.autocast(device_type, enabled=False):
        compute_weight, compute_bias = aligned_projection(weight, bias, dtype)
        for start in range(0, n, chunk_rows):
            end = min(start + chunk_rows, n)
            chunk = hidden[start:end].to(dtype)
            logits = _project(chunk, compute_weight, compute_bias, fp32_out=dtype != torch.float32)
            logits = transform(logits.float())
            chunk_targets = targets[start:end]
            # One fused log-softmax pass (logsumexp alone makes four passes over the logits).
            token_nll[start:end] = F.cross_entropy(logits, chunk_targets, reduction="none")
            token_missed[start:end] = (logits.argmax(dim=-1) != chunk_targets).float()
    zeros = token_nll.new_zeros(num_rows)
    row_greedy = zeros.index_add(0, rows, token_missed) == 0
    row_nll = row_sums(token_nll, rows, num_rows)
    return zeros.index_add(0, rows, token_nll * token_weights), row_nll, row_greedy


class ScoredTokens(NamedTuple):
    """A batch's scored positions: each one's target, weight in its row's mean and row."""

    targets: torch.Tensor
    token_weights: torch.Tensor
    rows: torch.Tensor
    num_rows: int


class _ScoredCrossEntropy(torch.autograd.Function):
    """Token cross-entropies of ``transform(hidden @ weight.T + bias)`` against ``targets``,
    ``chunk_rows`` positions at a time, summed per row: weighted by ``token_weights``
    (differentiable) and plain (not).

    The forward computes the gradients from each chunk's softmax at once
    (``d nll / d logits = softmax - onehot``, through the transform's derivative) and keeps only
    the ``(N, H)`` and ``(V, H)`` results; the backward scales them by the incoming gradient.
    That is exact when every row receives the same gradient, which the backward checks.
    Gradient matrix products run in the compute dtype (the autocast dtype, else the inputs'), in
    fp32 instead of fp16: the unscaled gradients would underflow there.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        tokens: ScoredTokens,
        transform: LogitTransform,
        chunk_rows: int,
        tied_head: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        ctx.tied_weight = weight if tied_head else None
        targets, token_weights, rows, num_rows = tokens
        device_type = hidden.device.type
        dtype = _compute_dtype(hidden)
        grad_dtype = torch.float32 if dtype == torch.float16 else dtype
        n, width = hidden.shape
        compute_weight, compute_bias = aligned_projection(weight, bias, dtype)
        # The compute-dtype copy serves the gradient products too, unless those run in fp32.
        projection = compute_weight
        if grad_dtype != dtype:
            projection = aligned_projection(weight, None, grad_dtype)[0]
        token_nll = torch.empty(n, dtype=torch.float32, device=hidden.device)
        grad_hidden = hidden.new_empty(n, width, dtype=torch.float32) if need_hidden else None
        # Over the padded vocabulary (aligned GEMMs); the backward returns the real rows'.
        zeros = functools.partial(hidden.new_zeros, dtype=torch.float32)
        grad_weight = zeros(len(compute_weight), width) if need_weight else None
        grad_bias = zeros(len(compute_weight)) if need_bias else None
        compiled = device_type == "cuda" and n >= COMPILED_LOSS_MIN_ROWS
        cross_entropy = compiled_chunk_cross_entropy() if compiled else chunk_cross_entropy
        fp32_out = not compiled and dtype != torch.float32  # compiled, the cast fuses into it
        with torch.autocast(device_type, enabled=False):
            for start in range(0, n, chunk_rows):
                end = min(start + chunk_rows, n)
                chunk = hidden[start:end].to(dtype)
                token_nll[start:end], grad_logits, chunk_grad_bias = cross_entropy(
                    _project(chunk, compute_weight, compute_bias, fp32_out),
                    targets[start:end],
                    token_weights[start:end],
                    grad_dtype,
                    need_bias,
                    transform.scale,
                    transform.softcap,
                )
                if grad_bias is not None and chunk_grad_bias is not None:
                    grad_bias += chunk_grad_bias
                if grad_hidden is not None:
                    grad_hidden[start:end] = grad_logits @ projection
                if grad_weight is not None:
                    add_product(grad_weight, grad_logits.T, chunk.to(grad_dtype))
        real = slice(len(weight))
        ctx.grads = (grad_hidden, *(g if g is None else g[real] for g in (grad_weight, grad_bias)))
        ctx.rows = rows
        ctx.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        row_nll = row_sums(token_nll, rows, num_rows)
        ctx.mark_non_differentiable(row_nll)
        row_mean_nll = token_nll.new_zeros(num_rows).index_add(0, rows, token_nll * token_weights)
        return row_mean_nll, row_nll

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_row_mean: torch.Tensor, _grad_row_nll: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        grad_hidden, grad_weight, grad_bias = ctx.grads
        # Held from here by the autograd engine alone, freed once used (ctx lives until the
        # whole backward has run).
        ctx.grads = None
        hidden_dtype, weight_dtype, bias_dtype = ctx.dtypes
        grad_row_mean = grad_row_mean.float()
        # Weight gradients were summed over rows in the forward: only a common factor applies.
        torch._assert_async(
            (grad_row_mean == grad_row_mean[0]).all(),
            "_ScoredCrossEntropy: rows must receive equal gradients (a loss over their mean)",
        )
        common = grad_row_mean[0]
        # In place: the forward's (V, H) gradient is not needed again, nor copied.
        grad_weight = None if grad_weight is None else grad_weight.mul_(common).to(weight_dtype)
        if ctx.tied_weight is not None and grad_weight is not None:
            tied, ctx.tied_weight = ctx.tied_weight, None
            tied.grad = grad_weight if tied.grad is None else tied.grad.add_(grad_weight)
            grad_weight = None
        return (
            None
            if grad_hidden is None
            else (grad_hidden * grad_row_mean[ctx.rows, None]).to(hidden_dtype),
            grad_weight,
            None if grad_bias is None else (grad_bias * common).to(bias_dtype),
            None,
            None,
            None,
            None,
        )


def add_product(total: torch.Tensor, left: torch.Tensor, right: torch.Tensor) -> None:
    """``total += left @ right`` for an fp32 ``total``. On a GPU the GEMM adds its product to
    ``total`` as it writes it (no product tensor, no pass adding it), and products of bf16 or
    fp16 matrices are added in fp32 (not rounded to their dtype first)."""
    if not total.is_cuda:
        total += left @ right
    elif left.dtype == torch.float32:
        total.addmm_(left, right)
    else:
        torch.addmm(total, left, right, out_dtype=torch.float32, out=total)


def _compute_dtype(hidden: torch.Tensor) -> torch.dtype:
    """The dtype the projection computes in: autocast's, else ``hidden``'s."""
    device_type = hidden.device.type
    autocast = torch.is_autocast_enabled(device_type)
    return torch.get_autocast_dtype(device_type) if autocast else hidden.dtype


def _project(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, fp32_out: bool
) -> torch.Tensor:
    """``hidden @ weight.T + bias``; with ``fp32_out``, on a GPU, written in fp32 by the GEMM
    itself, which saves a pass over the logits converting them (and their low-precision copy)."""
    if not fp32_out or hidden.device.type != "cuda":
        return F.linear(hidden, weight, bias)
    if bias is None:
        return torch.mm(hidden, weight.T, out_dtype=torch.float32)
    return torch.addmm(bias.float(), hidden, weight.T, out_dtype=torch.float32)
