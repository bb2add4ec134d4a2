"""A chunk of logits' cross-entropy against its targets and its gradient, eager or compiled (the
scored-position loss, :mod:`.loss`, runs it chunk by chunk)."""

from __future__ import annotations

import functools
from typing import Any

import torch


def chunk_cross_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    token_weights: torch.Tensor,
    grad_dtype: torch.dtype,
    need_bias: bool,
    scale: float = 1.0,
    softcap: float | None = None,
    out_of_place: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Cross-entropy of each row of ``logits`` ``(N, V)`` (after :class:`~.loss.LogitTransform`'s
    ``scale`` and ``softcap``) against ``targets`` ``(N,)`` in fp32, and
    ``d sum(token_weights * nll) / d logits`` (``grad_dtype``) and, if ``need_bias``, its fp32
    sum over rows.

    Eagerly the gradient is made in place over the logits, with a scatter at the targets: no
    second ``(N, V)`` tensor. ``out_of_place`` (the compiled loss) writes the same arithmetic as
    one expression instead, the targets picked by comparing column indices, which
    ``torch.compile`` turns into one kernel that writes the gradient once (compiled, the scatter
    makes it write fp32 gradients and read them again to weigh them). Both give the same bits."""
    logits = logits.float()
    if scale != 1.0:
        logits = logits * scale
    capped = None
    if softcap is not None:
        capped = torch.tanh(logits / softcap)
        logits = capped * softcap
    targets = targets[:, None]
    # softmax = exp(z - max) / sum(exp(z - max)), written as torch.compile recognises it: it
    # then finds the maximum and the sum in one pass over the logits (an "online softmax").
    row_max = logits.amax(dim=-1, keepdim=True)
    picked = logits.gather(1, targets)
    # d (weight_t * nll_t) / d logits_t = weight_t * (softmax_t - onehot_t).
    if out_of_place:
        exp = (logits - row_max).exp()
        total = exp.sum(dim=-1, keepdim=True)
        softmax = exp / total
        columns = torch.arange(logits.shape[1], device=logits.device)
        grad_logits = torch.where(columns == targets, softmax - 1.0, softmax)
        grad_logits = grad_logits * token_weights[:, None]
    else:
        exp = logits.sub_(row_max).exp_()
        total = exp.sum(dim=-1, keepdim=True)
        grad_logits = exp.div_(total)
        grad_logits.scatter_add_(1, targets, grad_logits.new_full(targets.shape, -1.0))
        grad_logits.mul_(token_weights[:, None])
    nll = (row_max + total.log() - picked)[:, 0]
    if capped is not None:  # through cap * tanh(z / cap): times 1 - tanh²
        grad_logits.mul_(1 - capped.square())
    if scale != 1.0:
        grad_logits.mul_(scale)
    grad_bias = grad_logits.sum(dim=0) if need_bias else None
    return nll, grad_logits.to(grad_dtype), grad_bias


@functools.cache
def compiled_chunk_cross_entropy() -> Any:
    """:func:`chunk_cross_entropy`, out of place, under ``torch.compile``
    (``TORCH_COMPILE_DISABLE=1``: eager), called through :func:`rows_dynamic`: its row count
    dynamic from the first call (else the second step's count compiles it again), the
    vocabulary fixed, which lets Inductor fit the kernel's reduction to it (a 4,096 × 50,304
    chunk on an H100: 0.53 ms against 0.84 ms with every size dynamic,
    ``cross_entropy_probe_h100_ab93899.json``)."""
    return rows_dynamic(torch.compile(functools.partial(chunk_cross_entropy, out_of_place=True)))


def rows_dynamic(compiled: Any) -> Any:
    """``compiled`` (a compiled :func:`chunk_cross_entropy`) called with the row dimension of
    its logits, targets and token weights marked dynamic, every other size fixed."""

    def call(
        logits: torch.Tensor, targets: torch.Tensor, token_weights: torch.Tensor, *rest: Any
    ) -> Any:
        for tensor in (logits, targets, token_weights):
            torch._dynamo.maybe_mark_dynamic(tensor, 0)
        return compiled(logits, targets, token_weights, *rest)

    return call
