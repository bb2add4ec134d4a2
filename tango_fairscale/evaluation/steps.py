"""The cached evaluation steps: a model's scores on a PIQA split, lm-eval's metrics from them."""

from __future__ import annotations

import torch
from tango import JsonFormat, Step
from tango.common.dataset_dict import DatasetDictBase
from tango.common.exceptions import ConfigurationError
from tango.integrations.torch import Model

from .. import compat  # noqa: F401  (Tango fixes)
from ..checks import boolean, positive_int, split_of
from ..data.queries import encode_pairs
from ..model.causal_lm import ModelWrapper
from ..parallel.precision import resolve_precision
from ..tasks import piqa
from .scoring import default_device, score_queries


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
    example's context once for both choices; :func:`~tango_fairscale.data.batches.packed_batch`):
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
        split_of(dataset_dict, split)
        positive_int("batch_size", batch_size)
        positive_int("max_batch_tokens", max_batch_tokens, optional=True)
        boolean("pack_sequences", pack_sequences)
        examples = list(dataset_dict[split])
        if not isinstance(model, ModelWrapper):
            raise ConfigurationError(f"needs a tango_fairscale::causal_lm model, got {type(model)}")
        device = default_device()
        resolved = resolve_precision(precision, device)
        if resolved.name not in ("32-true", "bf16-mixed"):
            raise ConfigurationError(
                f"scoring precision must be '32-true' or 'bf16-mixed', got {precision!r}"
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
        queries = encode_pairs(model.tokenizer, piqa.choice_pairs(examples), model.max_length)
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
        return piqa.piqa_predictions(
            examples, scores, [query.continuation_length for query in queries]
        )


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
        return piqa.metrics_from_predictions(predictions)
