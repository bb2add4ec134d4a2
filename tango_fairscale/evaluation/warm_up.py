"""A GPU's first scoring forward, run on a thread while the host prepares the real ones.

A process's first forward on a GPU loads each kernel it launches (CUDA loads them lazily) and
sets up cuBLAS: 0.4-1.0 s of host time on an H100 whatever the batch's size, then 10 ms for the
same forward again (``benchmarks/results/first_scoring_pass_h100_ff51f06.md``). Paid inside the
first scoring pass, the GPU waits through it. :func:`warmed_up` runs one small forward on a
thread as soon as the model is on the device; torch's operators release the GIL, so the loading
overlaps the host's own work before the first real forward (lm-eval building the task's requests,
the scoring schedule).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

import torch

from ..data.queries import Query
from .call import ModelCall
from .scoring import batch_maker

logger = logging.getLogger(__name__)

#: The warm-up batch: this many contexts, two continuations each (packed rows share a context).
WARM_UP_CONTEXTS = 4
#: Tokens of the warm-up batch's longest context (fewer for a model with a shorter window).
WARM_UP_CONTEXT_TOKENS = 120


@contextlib.contextmanager
def warmed_up(call: ModelCall, precision: Any, packed: bool) -> Iterator[ModelCall]:
    """``call``, whose first use waits for one small scoring forward started on a thread on
    entry, under ``precision`` (a :class:`~tango_fairscale.parallel.precision.Precision`) in
    batches as ``packed`` makes them; the thread is joined on exit too. On a CPU nothing starts:
    ``call`` itself (a CPU has nothing to load).

    Enter it inside the scoring precision's context
    (:func:`~tango_fairscale.evaluation.lm.scoring_precision`), which must outlive the thread:
    the thread enters the same ``forward_context``, and its choice of attention kernels is
    process-wide. The warm-up's answer is dropped; an error in it is logged at debug level only
    (the first real forward meets it again and reports it)."""
    if call.device.type != "cuda":
        yield call
        return
    batch = warm_up_batch(call.model.pad_token_id, call.model.max_length, packed)
    with forward_on_thread(call, batch, precision) as waiting_call:
        yield waiting_call


@contextlib.contextmanager
def forward_on_thread(
    call: ModelCall, batch: dict[str, torch.Tensor], precision: Any
) -> Iterator[ModelCall]:
    """``call``, whose every use waits for ``call(batch)``, started on a thread on entry (under
    ``precision``'s forward context, without gradients) and joined on exit at the latest."""
    thread = threading.Thread(
        target=_forward_quietly, args=(call, batch, precision), name="scoring-warm-up"
    )
    thread.start()

    def after_warm_up(real_batch: dict[str, Any]) -> Any:
        thread.join()
        return call(real_batch)

    try:
        yield ModelCall(after_warm_up, call.model, call.device, call.generation_refusal)
    finally:
        thread.join()


def warm_up_batch(pad_token_id: int, max_length: int, packed: bool) -> dict[str, torch.Tensor]:
    """A scoring batch of ``WARM_UP_CONTEXTS`` contexts of different lengths (at most
    ``WARM_UP_CONTEXT_TOKENS``, within the model's ``max_length``), two continuations each, made
    as scoring makes its batches; every token the pad token (any token would do)."""
    longest = max(1, min(WARM_UP_CONTEXT_TOKENS, max_length - 2 - WARM_UP_CONTEXTS))
    queries = [
        Query((pad_token_id,) * (max(1, longest - i) + continuation), continuation)
        for i in range(WARM_UP_CONTEXTS)
        for continuation in (1, 2)
    ]
    return batch_maker(packed, pad_token_id)(queries)


def _forward_quietly(call: ModelCall, batch: dict[str, torch.Tensor], precision: Any) -> None:
    try:
        with torch.no_grad(), precision.forward_context(call.device):
            call(batch)
    except Exception:  # the first real forward raises it again, with the step's message
        logger.debug("the scoring warm-up forward failed", exc_info=True)
