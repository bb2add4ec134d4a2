"""lm-eval's ``generate_until`` requests answered on one device, or with every rank of a process
group decoding a share: each request's ``gen_kwargs`` read as lm-eval's HF backend reads them,
its prompt encoded and left-truncated as that backend does, batches of the longest prompts
first decoded with a key/value cache (:mod:`~.decoder`), the answers gathered to every rank."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from tango.common import Tqdm

from ..data.prompts import StopSequences, answer_text, eos_text, prompt_tokens
from ..model.decoding import check_generation_config, eos_token_ids
from ..runtime.process_group import rank_and_world_size
from ..tasks.generation import SAMPLING_KEYS, Decoding, check_window, decoding_of
from .call import EvalOptions, GenerationSettings, ModelCall, agree_max, gather_objects
from .decoder import Row, decode_batch

logger = logging.getLogger(__name__)


def request_decodings(
    call: ModelCall, requests: Sequence[Any], settings: GenerationSettings
) -> list[Decoding]:
    """Each request's :class:`~tango_fairscale.tasks.generation.Decoding`, its stop sequences
    ending with the EOS text as lm-eval adds it; refused in one line (before any work): an engine
    that cannot generate, a model whose generation config changes greedy decoding, an unknown
    ``gen_kwargs`` key, a ``max_gen_toks`` beyond the model's window."""
    from tango.common.exceptions import ConfigurationError

    model = call.model
    if requests and call.generation_refusal is not None:
        raise ConfigurationError(call.generation_refusal)
    if requests:
        check_generation_config(model.model, type(model.model).__name__)
    eos = eos_text(model.tokenizer)
    decodings: dict[str, Decoding] = {}  # by the gen_kwargs' text
    result = []
    for request in requests:
        task = getattr(request, "task_name", None) or "task"
        gen_kwargs = request.args[1]
        key = f"{task}\0{sorted(gen_kwargs.items(), key=str)!r}"
        if key not in decodings:
            decoding = decoding_of(task, gen_kwargs, settings.max_gen_toks)
            check_window(task, decoding, model.max_length)
            decodings[key] = _completed(decoding, gen_kwargs, model.model, eos)
        result.append(decodings[key])
    return result


def _completed(decoding: Decoding, gen_kwargs: dict, model: Any, eos: str | None) -> Decoding:
    """``decoding`` with the EOS text among its stop sequences and, when sampling, the sampling
    settings the task leaves out taken from the model's generation config (as ``generate``
    merges them)."""
    import dataclasses

    until = list(decoding.until)
    if eos is not None and eos not in until:
        until.append(eos)
    fields: dict[str, Any] = {"until": tuple(until)}
    if decoding.do_sample:
        for key in SAMPLING_KEYS:
            if key not in gen_kwargs:
                fields[key] = getattr(model.generation_config, key, None)
    return dataclasses.replace(decoding, **fields)


def generate_on_all_ranks(
    call: ModelCall,
    requests: Sequence[Any],
    options: EvalOptions,
    settings: GenerationSettings,
) -> list[str]:
    """lm-eval's answers to ``requests`` (its ``Instance`` s, ``args`` = ``(context,
    gen_kwargs)``), in their order. Call on every rank with the same requests: rank ``r`` of
    ``W`` decodes every ``W``-th prompt of each ``gen_kwargs`` group, longest first, in batches
    of at most ``options.batch_size``; the answers are gathered to every rank."""
    decodings = request_decodings(call, requests, settings)
    model = call.model
    rank, world_size = rank_and_world_size()
    batches: list[tuple[Decoding, list[Row]]] = []
    for decoding, indices in _groups(decodings).items():
        contexts = [requests[i].args[0] for i in indices]
        prompts = prompt_tokens(model.tokenizer, contexts, model.max_length - decoding.max_gen_toks)
        order = sorted(range(len(indices)), key=lambda k: (-len(prompts[k]), indices[k]))
        mine = order[rank::world_size]
        rows = [
            Row(indices[k], prompts[k], _generator(decoding, settings.seed + indices[k], call))
            for k in mine
        ]
        for start in range(0, len(rows), options.batch_size):
            batches.append((decoding, rows[start : start + options.batch_size]))
    slots = agree_max(len(batches), call.device)
    eos_ids = eos_token_ids(model.model)
    answers: dict[int, str] = {}
    started = time.perf_counter()
    generated = 0
    shown = options.progress and rank == 0
    bar = Tqdm.tqdm(
        total=sum(len(rows) for _, rows in batches), desc="Generating", disable=not shown
    )
    with _eager():
        for slot in range(slots):
            decoding, rows = batches[slot] if slot < len(batches) else (decodings[0], [])
            stops = StopSequences(model.tokenizer, decoding.until) if rows else None
            generated += decode_batch(call, rows or None, decoding, stops, eos_ids)
            for row in rows:
                answers[row.index] = answer_text(model.tokenizer, row.tokens, decoding.until)
            bar.update(len(rows))
            seconds = time.perf_counter() - started
            bar.set_postfix({"tok/s": f"{generated * world_size / max(seconds, 1e-9):,.0f}"})
    bar.close()
    parts = gather_objects((answers, generated))
    _log_rate(len(requests), sum(count for _, count in parts), time.perf_counter() - started)
    merged = {index: text for part, _ in parts for index, text in part.items()}
    return [merged[index] for index in range(len(requests))]


def _groups(decodings: Sequence[Decoding]) -> dict[Decoding, list[int]]:
    """Request indices by decoding, in the order of each decoding's first request."""
    groups: dict[Decoding, list[int]] = {}
    for index, decoding in enumerate(decodings):
        groups.setdefault(decoding, []).append(index)
    return groups


def _generator(decoding: Decoding, seed: int, call: ModelCall) -> torch.Generator | None:
    if not decoding.do_sample:
        return None
    return torch.Generator(device=call.device).manual_seed(seed)


@contextlib.contextmanager
def _eager() -> Iterator[None]:
    """Compiled units run eagerly while decoding (a growing cache would recompile them)."""
    set_stance = getattr(torch.compiler, "set_stance", None)
    if set_stance is None:
        yield
        return
    with set_stance("force_eager"):
        yield


def _log_rate(requests: int, tokens: int, seconds: float) -> None:
    logger.info(
        "generated %s tokens for %s requests in %.2f s (%s tokens/s)",
        f"{tokens:,}",
        f"{requests:,}",
        seconds,
        f"{tokens / max(seconds, 1e-9):,.0f}",
    )
