"""PIQA scoring: cached predictions and metrics steps, and the all-ranks in-training validation.

Scoring is batched: queries are sorted by length, right-padded and scored one forward per batch.
Under data-parallel or sharded training every rank scores a slice of the examples *through the
engine's wrapped model* (never an inner module), every rank runs the same number of forwards (ranks
with fewer batches repeat a dummy batch, so FSDP all-gathers never hang), and the counts are summed.
"""

from __future__ import annotations

import collections
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from tango import JsonFormat, Step
from tango.common import Tqdm
from tango.common.dataset_dict import DatasetDictBase
from tango.common.exceptions import ConfigurationError
from tango.integrations.torch import Model

from .batching import Query, choice_queries, collate, packed_batch, scoring_batches
from .engines.base import resolve_precision
from .model import ModelWrapper, move_batch

Forward = Callable[[dict[str, torch.Tensor]], Mapping[str, torch.Tensor]]


#: Forwards queued on a GPU at most (a few batches ahead: the GPU never waits for Python between
#: them, yet the progress bar and the memory held by queued batches stay bounded).
QUEUED_FORWARDS = 4

#: Packed scoring rows feed the model a multiple of this many positions (aligned attention masks).
SCORING_WIDTH_MULTIPLE = 8


def score_queries(
    forward: Forward,
    queries: Sequence[Query],
    *,
    batch_size: int,
    pad_token_id: int,
    device: torch.device,
    max_batch_tokens: int | None = None,
    num_forwards: int | None = None,
    packed: bool = False,
    progress: bool = True,
) -> list[float]:
    """Log-likelihood of each query's continuation, in the order of ``queries``.

    Batches as :func:`~tango_fairscale.batching.scoring_batches` makes them: right-padded rows
    or, ``packed`` (for a forward that takes packed batches), rows packed by
    :func:`~tango_fairscale.batching.packed_batch`. Results stay on the device until the end;
    Python runs at most ``QUEUED_FORWARDS`` forwards ahead of a GPU. ``num_forwards`` (at least
    the number of batches) pads the work with repeated forwards of a one-query batch whose
    results are discarded, so that all ranks call ``forward`` equally often.
    """
    batches = scoring_batches(queries, batch_size, max_batch_tokens, packed)
    if packed:
        make_batch = functools.partial(
            packed_batch, pad_token_id=pad_token_id, width_multiple=SCORING_WIDTH_MULTIPLE
        )
    else:
        make_batch = functools.partial(collate, pad_token_id=pad_token_id)
    filler = [Query((pad_token_id, pad_token_id), 1)]  # any tokens serve
    results = []
    queued: collections.deque[tuple[Any, int]] = collections.deque()  # (done event, rows)
    depth = QUEUED_FORWARDS if device.type == "cuda" else 0  # a CPU forward is done on return
    bar = Tqdm.tqdm(total=len(queries), desc="Scoring", unit="query", disable=not progress)
    for index in range(max(num_forwards or 0, len(batches))):
        rows = [queries[i] for i in batches[index]] if index < len(batches) else filler
        loglikelihood = forward(move_batch(make_batch(rows), device))["loglikelihood"]
        if index < len(batches):
            results.append(loglikelihood.float())
        done = torch.cuda.Event() if device.type == "cuda" else None
        if done is not None:
            done.record()
        queued.append((done, len(rows) if index < len(batches) else 0))
        while len(queued) > depth:
            oldest, num_rows = queued.popleft()
            if oldest is not None:
                oldest.synchronize()
            bar.update(num_rows)
    values = torch.cat(results).cpu().tolist() if results else []
    bar.update(sum(num_rows for _, num_rows in queued))
    bar.close()
    scores = [0.0] * len(queries)
    order = [i for batch_indices in batches for i in batch_indices]
    for query_index, value in zip(order, values, strict=True):
        scores[query_index] = value
    return scores


def piqa_predictions(
    examples: Sequence[Mapping[str, Any]], queries: Sequence[Query], scores: Sequence[float]
) -> list[dict[str, Any]]:
    """Per example: both choices' log-likelihoods, token and character lengths, the label."""
    predictions = []
    for index, example in enumerate(examples):
        choices = (example["sol1"], example["sol2"])
        predictions.append(
            {
                "index": index,
                "label": example["label"],
                "loglikelihoods": [scores[2 * index], scores[2 * index + 1]],
                "token_lengths": [
                    q.continuation_length for q in queries[2 * index : 2 * index + 2]
                ],
                "char_lengths": [len(choice) for choice in choices],
            }
        )
    return predictions


def correct_counts(predictions: Sequence[Mapping[str, Any]]) -> tuple[int, int]:
    """``(acc hits, acc_norm hits)``: argmax of score, and of score / characters; ties → first."""
    hits = hits_norm = 0
    for prediction in predictions:
        scores = prediction["loglikelihoods"]
        normed = [s / max(n, 1) for s, n in zip(scores, prediction["char_lengths"])]
        hits += int(_argmax(scores) == prediction["label"])
        hits_norm += int(_argmax(normed) == prediction["label"])
    return hits, hits_norm


def _argmax(values: Sequence[float]) -> int:
    return max(range(len(values)), key=lambda i: (values[i], -i))


def metrics_from_predictions(predictions: Sequence[Mapping[str, Any]]) -> dict[str, float | int]:
    """``acc``, ``acc_norm``, their standard errors (lm-eval's mean_stderr), ``num_examples``."""
    labelled = [p for p in predictions if p["label"] in (0, 1)]
    if not labelled:
        raise ValueError(
            "no labelled predictions to compute metrics from (PIQA's test split is unlabelled); "
            "score the 'validation' split"
        )
    hits, hits_norm = correct_counts(labelled)
    n = len(labelled)
    return {
        "acc": hits / n,
        "acc_stderr": _mean_stderr(hits, n),
        "acc_norm": hits_norm / n,
        "acc_norm_stderr": _mean_stderr(hits_norm, n),
        "num_examples": n,
    }


def _mean_stderr(hits: int, n: int) -> float:
    """Sample standard deviation of 0/1 outcomes over √n (lm-eval's ``mean_stderr``)."""
    if n < 2:
        return float("nan")
    mean = hits / n
    variance = (hits * (1 - mean) ** 2 + (n - hits) * mean**2) / (n - 1)
    return math.sqrt(variance / n)


def validate_all_ranks(
    forward: Forward,
    examples: Sequence[Mapping[str, Any]],
    tokenizer: Any,
    *,
    max_length: int,
    batch_size: int,
    device: torch.device,
    packed: bool,
    progress: bool,
) -> dict[str, float | int]:
    """PIQA ``acc`` / ``acc_norm`` over ``examples``, every rank scoring its share (``packed``:
    in packed batches, see :func:`score_queries`).

    Call on every rank of the process group (or without one). Rank ``r`` scores examples
    ``r, r + W, ...``; the number of forwards is agreed with a max all-reduce first, and the hit
    counts are summed, so the result equals single-process scoring.
    """
    distributed = dist.is_available() and dist.is_initialized()
    rank, world_size = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    mine = list(examples[rank::world_size])
    queries = choice_queries(mine, tokenizer, max_length)
    num_forwards = len(scoring_batches(queries, batch_size, packed=packed))
    if distributed:
        agreed = torch.tensor([num_forwards], device=device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        num_forwards = int(agreed.item())
    scores = score_queries(
        forward,
        queries,
        batch_size=batch_size,
        pad_token_id=tokenizer.pad_token_id,
        device=device,
        num_forwards=num_forwards,
        packed=packed,
        progress=progress,
    )
    hits, hits_norm = correct_counts(piqa_predictions(mine, queries, scores))
    counts = torch.tensor([hits, hits_norm, len(mine)], dtype=torch.float64, device=device)
    if distributed:
        dist.all_reduce(counts)
    hits, hits_norm, n = (int(c) for c in counts.tolist())
    return {"acc": hits / n, "acc_norm": hits_norm / n, "num_examples": n}


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


@Step.register("tango_fairscale::piqa_predictions")
class PiqaPredictionsStep(Step[list]):
    """Score both choices of every example of one PIQA split with a model.

    Registered as a Tango ``Step`` under the name ``"tango_fairscale::piqa_predictions"``.
    Runs on the GPU when there is one. A forward scores at most ``batch_size`` queries of similar
    length and, with ``max_batch_tokens``, at most that many padded tokens (so short queries go
    in large batches and long ones in small); neither is part of the cache key.
    ``precision`` ``32-true`` (default: exact lm-eval scores) or ``bf16-mixed`` (autocast: faster
    on GPUs; summed log-likelihoods within about 2e-3 relative of fp32's, measured on PIQA
    validation; ``auto`` picks it on a bf16 GPU). ``pack_sequences`` scores packed batches (an
    example's context once for both choices; :func:`~tango_fairscale.batching.packed_batch`):
    the same scores up to float rounding in a fifth fewer positions (PIQA validation on an H200:
    1.01x the queries/s in ``bf16-mixed``, 1.08x in ``32-true``); not part of the cache key
    either.

    Returns one dict per example: ``index``, ``label``, ``loglikelihoods`` (two floats),
    ``token_lengths`` and ``char_lengths`` (two ints each).

    Example (Jsonnet)::

        predictions: {type: "tango_fairscale::piqa_predictions", model: {ref: "trained_model"},
                      dataset_dict: {ref: "piqa"}, split: "validation", batch_size: 64}
    """

    VERSION = "001"
    DETERMINISTIC = True
    CACHEABLE = True
    FORMAT = JsonFormat()
    SKIP_ID_ARGUMENTS = {"batch_size", "max_batch_tokens", "pack_sequences"}

    def run(  # type: ignore[override]
        self,
        model: Model,
        dataset_dict: DatasetDictBase,
        split: str = "validation",
        batch_size: int = 32,
        precision: str = "32-true",
        max_batch_tokens: int | None = None,
        pack_sequences: bool = False,
    ) -> list:
        if split not in dataset_dict:
            raise ConfigurationError(
                f"split {split!r} is not in the dataset; choose one of "
                f"{sorted(dataset_dict.keys())}"
            )
        sizes = {"batch_size": batch_size}
        if max_batch_tokens is not None:
            sizes["max_batch_tokens"] = max_batch_tokens
        for name, value in sizes.items():
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigurationError(f"{name} must be an integer, got {value!r}")
            if value < 1:
                raise ConfigurationError(f"{name} must be at least 1, got {value}")
        examples = list(dataset_dict[split])
        if not examples:
            raise ConfigurationError(f"split {split!r} holds no examples; check 'limit'")
        if not isinstance(model, ModelWrapper):
            raise ConfigurationError(f"needs a tango_fairscale::causal_lm model, got {type(model)}")
        device = default_device()
        resolved = resolve_precision(precision, device)
        if resolved.name not in ("32-true", "bf16-mixed"):
            raise ConfigurationError(
                f"scoring precision must be '32-true' or 'bf16-mixed', got {precision!r}"
            )
        if not isinstance(pack_sequences, bool):
            raise ConfigurationError(
                f"pack_sequences must be true or false, got {pack_sequences!r}"
            )
        if pack_sequences and not model.supports_packing:
            raise ConfigurationError(
                "pack_sequences needs an attention that takes masks ('sdpa' or 'eager'), the "
                f"model uses {model.model.config._attn_implementation!r}; set it to false"
            )
        model = model.to(device).eval()
        # All queries first: tokenizing in parts while the GPU scores the previous part measured
        # slower on an H200 (14.6k vs 17.3k queries/s: eval_speed_parts*_h200_run13.md), and on a
        # worker thread in growing parts no faster (scoring_probe_tokenizing_parts_h200_run31.md).
        queries = choice_queries(examples, model.tokenizer, model.max_length)
        autocast = torch.autocast(device.type, torch.bfloat16, enabled=resolved.mixed)
        # no_grad, not inference_mode: under inference_mode autocast re-casts every weight in
        # every forward (its cache of casts only serves tensors that require gradients).
        with torch.no_grad(), autocast:
            scores = score_queries(
                lambda batch: model(**batch),
                queries,
                batch_size=batch_size,
                pad_token_id=model.pad_token_id,
                device=device,
                max_batch_tokens=max_batch_tokens,
                packed=pack_sequences,
            )
        return piqa_predictions(examples, queries, scores)


@Step.register("tango_fairscale::piqa_metrics")
class PiqaMetricsStep(Step[dict]):
    """Accuracy metrics from PIQA predictions, as lm-evaluation-harness's ``piqa`` defines them.

    Registered as a Tango ``Step`` under the name ``"tango_fairscale::piqa_metrics"``.

    Returns ``{"acc", "acc_stderr", "acc_norm", "acc_norm_stderr", "num_examples"}``.

    Example (Jsonnet)::

        metrics: {type: "tango_fairscale::piqa_metrics", predictions: {ref: "predictions"}}
    """

    VERSION = "001"
    DETERMINISTIC = True
    CACHEABLE = True
    FORMAT = JsonFormat()

    def run(self, predictions: list) -> dict:  # type: ignore[override]
        return metrics_from_predictions(predictions)
