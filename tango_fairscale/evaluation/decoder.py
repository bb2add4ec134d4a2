"""One generation batch decoded through the seam with a key/value cache: the left-padded prompts
in one forward, then one forward per new token, greedy or sampled, each row stopping as
lm-eval's HF backend stops it (an end-of-sequence token, a stop sequence, ``max_gen_toks``).

Under a process group every rank runs the same number of forwards: after each token the ranks
agree whether any row of any rank goes on, and a rank with nothing left to decode idles.
On one device the next forward is queued before the last token is read on the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import compat  # noqa: F401  (the fixes; transformers' before it is imported)
from ..data.prompts import StopSequences
from ..model.decoding import EXPLICIT_MASKS, explicit_mask, keep_rows, new_cache
from ..tasks.generation import Decoding
from .call import ModelCall, agree_max


@dataclass
class Row:
    """One request's prompt and what it has generated."""

    index: int  # the request's position in the evaluation
    prompt: list[int]
    generator: torch.Generator | None = None  # for sampling
    tokens: list[int] = field(default_factory=list)
    done: bool = False


class _Batch:
    """The live rows of a batch on the device: their cache, attention mask, positions and the
    logits of their next token."""

    def __init__(self, call: ModelCall, rows: list[Row], max_gen_toks: int) -> None:
        # Imported here, as in .decoding: transformers' imports would otherwise be paid by every
        # ``tango run``, even one that decodes nothing.
        from transformers import StaticCache

        device = call.device
        width = max(len(row.prompt) for row in rows)
        pad = call.model.pad_token_id
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros(len(rows), width + max_gen_toks, dtype=torch.long)
        for i, row in enumerate(rows):  # left padding
            ids[i, width - len(row.prompt) :] = torch.tensor(row.prompt)
            mask[i, width - len(row.prompt) :] = 1
        self.call, self.rows, self.width = call, rows, width
        self.mask = mask.to(device)
        self.cache = new_cache(call.model.model, width + max_gen_toks)
        # A preallocated cache holds every slot (later ones masked by causality): masks over all
        # of it, built here where the model takes them; a growing one: the tokens so far.
        self.whole_mask = isinstance(self.cache, StaticCache)
        implementation = call.model.model.config._attn_implementation
        self.implementation = implementation if implementation in EXPLICIT_MASKS else None
        prompt_mask = self.mask[:, :width]
        positions = (prompt_mask.cumsum(-1) - 1).masked_fill(prompt_mask == 0, 0)
        self.logits = call(
            {
                "input_ids": ids.to(device),
                "attention_mask": self._mask(width, width),
                "position_ids": positions,
                "past_key_values": self.cache,
            }
        )["logits"]
        self.positions = positions[:, -1]
        self.steps = 0  # tokens chosen so far

    def _mask(self, tokens: int, queries: int) -> Any:
        """The attention mask of ``queries`` new tokens, ``tokens`` in all."""
        if not self.whole_mask:
            return self.mask[:, :tokens]
        if self.implementation is None:
            return self.mask
        return explicit_mask(self.mask, queries, tokens - queries, self.implementation)

    def advance(self, chosen: torch.Tensor) -> None:
        """Feed the chosen tokens: the logits of the next ones."""
        self.positions = self.positions + 1
        self.logits = self.call(
            {
                "input_ids": chosen[:, None],
                "attention_mask": self._mask(self.width + self.steps, 1),
                "position_ids": self.positions[:, None],
                "past_key_values": self.cache,
            }
        )["logits"]

    def keep(self, live: list[int]) -> None:
        """Only the rows at ``live`` go on (the cache copied once: when half have stopped)."""
        index = torch.tensor(live, device=self.call.device)
        keep_rows(self.cache, index)
        self.logits, self.mask, self.positions = (
            self.logits[index],
            self.mask[index],
            self.positions[index],
        )
        self.rows = [self.rows[i] for i in live]


def choose(logits: torch.Tensor, rows: Sequence[Row], decoding: Decoding) -> torch.Tensor:
    """The next token of each row: the argmax (the first of equal maxima), or a sample from the
    distribution that ``generate``'s warpers make of the logits, from the row's generator."""
    if not decoding.do_sample:
        return logits.argmax(dim=-1)
    scores = _warped(logits, decoding)
    probs = torch.softmax(scores, dim=-1)
    chosen = [
        torch.multinomial(probs[i], num_samples=1, generator=row.generator)
        for i, row in enumerate(rows)
    ]
    return torch.cat(chosen)


def _warped(logits: torch.Tensor, decoding: Decoding) -> torch.Tensor:
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    warpers: list[Any] = []
    if decoding.temperature is not None and decoding.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(decoding.temperature))
    if decoding.top_k is not None and decoding.top_k != 0:
        warpers.append(TopKLogitsWarper(top_k=decoding.top_k))
    if decoding.top_p is not None and decoding.top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=decoding.top_p))
    if decoding.min_p is not None:
        warpers.append(MinPLogitsWarper(min_p=decoding.min_p))
    scores = logits
    for warper in warpers:  # none of them reads the input ids
        scores = warper(None, scores)
    return scores


def decode_batch(
    call: ModelCall,
    rows: list[Row] | None,
    decoding: Decoding,
    stops: StopSequences | None,
    eos_ids: set[int],
) -> int:
    """Generate the tokens of ``rows`` (``None``: this rank has no batch left and idles in step
    with the others); the number of tokens generated. Call on every rank."""
    batch = _Batch(call, rows, decoding.max_gen_toks) if rows else None
    if batch is None:
        call.idle()
    generated = 0
    while True:
        if batch is not None and batch.rows:
            chosen = choose(batch.logits, batch.rows, decoding)
            host = chosen.to("cpu", non_blocking=True)
            ready = _event(call.device)
            batch.steps += 1
            if batch.steps < decoding.max_gen_toks:
                batch.advance(chosen)  # queued before the host reads this step's tokens
            else:
                call.idle()
            if ready is not None:
                ready.synchronize()
            generated += _observe(batch, host.tolist(), decoding, stops, eos_ids)
        else:
            call.idle()
        going_on = batch is not None and bool(batch.rows)
        if not agree_max(int(going_on), call.device):
            return generated


def _observe(
    batch: _Batch,
    tokens: list[int],
    decoding: Decoding,
    stops: StopSequences | None,
    eos_ids: set[int],
) -> int:
    """Append each live row's token and mark the rows that stop; drop them from the batch once
    half of it has stopped. The number of tokens appended."""
    live = [row for row in batch.rows if not row.done]
    for row, token in zip(batch.rows, tokens, strict=True):
        if not row.done:
            row.tokens.append(token)
            row.done = token in eos_ids or len(row.tokens) >= decoding.max_gen_toks
    if stops is not None:
        going = [row for row in live if not row.done]
        for row, stopped in zip(going, stops.stopped([row.tokens for row in going]), strict=True):
            row.done = stopped
    remaining = [i for i, row in enumerate(batch.rows) if not row.done]
    if not remaining:
        batch.rows = []
    elif 2 * len(remaining) <= len(batch.rows):
        batch.keep(remaining)
    return len(live)


def _event(device: torch.device) -> Any:
    if device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record()
    return event
