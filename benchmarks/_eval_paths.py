"""eval_speed.py's measured paths: what each timing runs, and how it is timed.

* :func:`run_scoring`: the package's PIQA scoring as its evaluation runs it: both choices of
  every example encoded as lm-eval encodes them, then ``score_queries`` (length-sorted or packed
  batches, one forward each) under ``no_grad``, in bf16 autocast for ``bf16-mixed``. Built from
  the package's primitives (``data.queries.encode_pairs``, ``evaluation.scoring.score_queries``),
  not from an evaluation step, so it measures the same work while the steps change;
* :func:`encode_choices`: tokenization alone, :func:`score` ``score_queries`` on those queries,
  and :func:`device_batches` / :func:`forwards` the model's forwards on batches already on the
  device;
* :func:`one_at_a_time`: lm-evaluation-harness with batch size 1 (full-vocabulary logits,
  ``log_softmax``, the sum at the continuation).
* :func:`batch_layout` counts the forwards and padding a scoring schedule makes;
  :func:`variant_context` wraps a measurement in fp32, TF32 matmuls or bf16 autocast;
  :func:`profile_run` runs one step under ``torch.profiler`` (GPU kernel ms by kind).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import _bench
import _piqa


class Clock:
    """Wall time with device synchronisation on both ends."""

    def __init__(self, device: Any) -> None:
        self.device = device

    def sync(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def time(self, function: Callable[[], Any]) -> tuple[Any, float]:
        self.sync()
        begin = time.perf_counter()
        value = function()
        self.sync()
        return value, time.perf_counter() - begin


def run_scoring(
    model: Any,
    examples: list[dict[str, Any]],
    *,
    batch_size: int,
    precision: str = "32-true",
    max_batch_tokens: int | None = None,
    pack_sequences: bool = False,
) -> list[float]:
    """Both choices' log-likelihoods of every example (``32-true`` or ``bf16-mixed``)."""
    import torch

    from tango_fairscale.evaluation.call import EvalOptions
    from tango_fairscale.evaluation.scoring import score_queries

    if precision not in ("32-true", "bf16-mixed"):
        raise SystemExit(f"scoring precision {precision!r}: use 32-true or bf16-mixed")
    device = next(model.parameters()).device
    queries = encode_choices(model, examples)
    # no_grad, not inference_mode: autocast caches its casts of the weights only under no_grad.
    autocast = torch.autocast(device.type, torch.bfloat16, enabled=precision == "bf16-mixed")
    with torch.no_grad(), autocast:
        sizes = EvalOptions(batch_size, max_batch_tokens, packed=pack_sequences, progress=False)
        scores = score_queries(
            lambda batch: model(**batch), queries, sizes, pad_token_id=model.pad_token_id,
            device=device,
        )  # fmt: skip
    return _piqa.loglikelihoods(scores)


def encode_choices(model: Any, examples: list[dict[str, Any]]) -> list[Any]:
    from tango_fairscale.data.queries import encode_pairs

    return encode_pairs(model.tokenizer, _piqa.choice_pairs(examples), model.max_length)


def score(model: Any, queries: list[Any], batch_size: int, device: Any) -> list[float]:
    """``score_queries`` on pre-tokenized queries: collate + copy + forward + ``.cpu()``."""
    import torch

    from tango_fairscale.evaluation.call import EvalOptions
    from tango_fairscale.evaluation.scoring import score_queries

    with torch.no_grad():
        sizes = EvalOptions(batch_size, max_batch_tokens=None, progress=False)
        scores = score_queries(
            lambda batch: model(**batch), queries, sizes, pad_token_id=model.pad_token_id,
            device=device,
        )  # fmt: skip
    return _piqa.loglikelihoods(scores)


def device_batches(model: Any, queries: list[Any], batch_size: int, device: Any) -> list[Any]:
    """Right-padded scoring batches, collated and moved to the device ahead of timing."""
    from tango_fairscale.data.batches import collate
    from tango_fairscale.data.schedules import scoring_batches
    from tango_fairscale.runtime.devices import move_batch

    return [
        move_batch(collate([queries[i] for i in b], model.pad_token_id), device)
        for b in scoring_batches(queries, batch_size)
    ]


def forwards(model: Any, batches: list[Any]) -> None:
    import torch

    with torch.no_grad():
        for batch in batches:
            model(**batch)


def one_at_a_time(model: Any, queries: list[Any], device: Any) -> list[float]:
    """lm-eval's scoring with batch size 1: full logits, log_softmax, gather the continuation."""
    import torch

    scores = []
    with torch.inference_mode():
        for query in queries:
            tokens = torch.tensor([query.tokens], device=device)
            logits = model.model(tokens[:, :-1]).logits[0].float()
            log_probs = torch.log_softmax(logits, dim=-1)
            n = query.continuation_length
            targets = tokens[0, -n:]
            scores.append(float(log_probs[-n:].gather(1, targets[:, None]).sum()))
    return scores


def batch_layout(
    queries: list[Any], batch_size: int, budget: int | None, packed: bool, pad_token_id: int
) -> dict[str, Any]:
    """Forwards, positions fed to the model and the padding among them, as scoring builds them."""
    from tango_fairscale.data.batches import collate, packed_batch
    from tango_fairscale.data.schedules import scoring_batches
    from tango_fairscale.evaluation.scoring import SCORING_WIDTH_MULTIPLE

    batches = scoring_batches(queries, batch_size, budget, packed)
    fed = real = 0
    for indices in batches:
        rows = [queries[i] for i in indices]
        if packed:
            mask = packed_batch(rows, pad_token_id, SCORING_WIDTH_MULTIPLE)["attention_mask"]
        else:
            mask = collate(rows, pad_token_id)["attention_mask"][:, :-1]
        fed += mask.numel()
        real += int(mask.sum())
    return {
        "num_forwards": len(batches),
        "positions_fed": fed,
        "padding_fraction": round(1 - real / fed, 4),
    }


@contextlib.contextmanager
def variant_context(name: str, device: Any) -> Iterator[None]:
    """fp32 as is; tf32 matmuls; or bf16 autocast around everything inside."""
    import torch

    if name == "fp32":
        yield
    elif name == "tf32":
        previous = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("high")
        try:
            yield
        finally:
            torch.set_float32_matmul_precision(previous)
    elif name == "bf16-autocast":
        with torch.autocast(device.type, dtype=torch.bfloat16):
            yield
    else:
        raise SystemExit(f"unknown variant {name!r}; use fp32, tf32 or bf16-autocast")


def profile_run(run: Callable[[], Any], clock: Clock) -> dict[str, float]:
    """One (warm) run under ``torch.profiler``: wall ms and GPU kernel ms by kind."""
    from torch.profiler import ProfilerActivity, profile

    clock.sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        _, seconds = clock.time(run)
    return {
        "wall": round(1000 * seconds, 3),
        **_bench.gpu_ms_by_kind(_bench.kernel_totals(prof.events()), 1),
    }
