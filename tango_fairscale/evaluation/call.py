"""The seam between evaluation and a model: :class:`ModelCall` runs a batch through the model as
the engine runs it (its wrapped model, precision and sharding) on this rank; the options of
scoring and generation; and the agreements between ranks that keep their calls in step.

Every algorithm over the seam (scoring, generation) makes every rank of a process group call it
equally often, so that the all-gathers of sharded engines always have every rank.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..checks import integer, positive_int
from ..model.causal_lm import ModelWrapper
from ..model.decoding import new_cache
from ..runtime.devices import move_batch
from ..runtime.process_group import alone
from ..tasks.generation import DEFAULT_MAX_GEN_TOKS
from . import DEFAULT_BATCH_SIZE, DEFAULT_MAX_BATCH_TOKENS

#: lm-eval's default seed of torch's generator (``simple_evaluate``'s ``torch_random_seed``).
DEFAULT_SEED = 1234


@dataclass(frozen=True)
class EvalOptions:
    """How requests are batched and shown. None of them changes an answer beyond float rounding
    (in fp32, a log-likelihood moves by less than 1e-4 at |ll| up to 2,000: each query's
    per-token values are summed in float64), so none is part of a cache key.

    :param batch_size: queries per scoring batch; prompts per generation batch.
    :param max_batch_tokens: tokens per scoring batch (``None``: no limit).
    :param packed: pack scoring queries into rows (for a model that takes packed batches).
    :param progress: show progress bars.
    """

    batch_size: int = DEFAULT_BATCH_SIZE
    max_batch_tokens: int | None = DEFAULT_MAX_BATCH_TOKENS
    packed: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        positive_int("batch_size", self.batch_size)
        positive_int("max_batch_tokens", self.max_batch_tokens, optional=True)


@dataclass(frozen=True)
class GenerationSettings:
    """What ``generate_until`` answers depend on besides the task: part of a step's cache key.

    :param max_gen_toks: tokens generated at most for a task whose ``generation_kwargs`` set
        none (lm-eval's HF backend: 256).
    :param seed: seeds sampling (for tasks with ``do_sample``): request ``i`` of an evaluation
        samples from a generator seeded with ``seed + i``, whatever the batch or world size.
    """

    max_gen_toks: int = DEFAULT_MAX_GEN_TOKS
    seed: int = DEFAULT_SEED

    def __post_init__(self) -> None:
        positive_int("max_gen_toks", self.max_gen_toks)
        integer("generation_seed", self.seed)


class ModelCall:
    """A model call on this rank: ``call(batch)`` runs ``batch`` (a scoring batch, or a decoding
    one with ``past_key_values``) through the wrapped model under its precision, without
    gradients; :attr:`model` is the :class:`ModelWrapper` inside, for its tokenizer and config
    only (calling it directly would bypass FSDP's forward). Call on every rank equally often."""

    def __init__(
        self,
        forward: Callable[[dict[str, Any]], Mapping[str, torch.Tensor]],
        model: ModelWrapper,
        device: torch.device,
        generation_refusal: str | None = None,
    ) -> None:
        self.forward = forward
        self.model = model
        self.device = device
        #: Why this model call cannot generate text (``None``: it can).
        self.generation_refusal = generation_refusal

    @classmethod
    def of_engine(cls, engine: Any) -> ModelCall:
        """Through an engine's ``forward_eval``: its wrapped model, precision and sharding."""
        refusal = getattr(engine, "generation_refusal", None)
        return cls(engine.forward_eval, engine.wrapped_model, engine.device, refusal)

    @classmethod
    def local(cls, model: ModelWrapper, device: torch.device) -> ModelCall:
        """Through ``model`` itself, on ``device``, in one process (the caller sets the
        precision: :func:`~tango_fairscale.evaluation.lm.scoring_precision`)."""
        return cls(lambda batch: model(**move_batch(batch, device)), model, device)

    def __call__(self, batch: dict[str, Any]) -> Mapping[str, torch.Tensor]:
        return self.forward(batch)

    def idle(self) -> None:
        """One forward whose result is dropped, for a rank that has run out of work while others
        have not (nothing without a process group)."""
        if alone():
            return
        pad = self.model.pad_token_id
        self(
            {
                "input_ids": torch.tensor([[pad]], device=self.device),
                "attention_mask": torch.ones(1, 1, dtype=torch.long, device=self.device),
                "position_ids": torch.zeros(1, 1, dtype=torch.long, device=self.device),
                "past_key_values": new_cache(self.model.model),
            }
        )


def agree_max(value: int, device: torch.device) -> int:
    """The largest ``value`` of all ranks (``value`` without a process group)."""
    if alone():
        return value
    agreed = torch.tensor([value], device=device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    return int(agreed.item())
