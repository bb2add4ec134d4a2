"""lm-eval's ``generate_until`` requests answered on one device, or with every rank of a process
group decoding a share: each request's ``gen_kwargs`` read as lm-eval's HF backend reads them,
its prompt encoded and left-truncated as that backend does, batches of the longest prompts
first decoded with a key/value cache (:mod:`~.decoder`), the answers gathered to every rank."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from tango.common import Tqdm
from tango.common.exceptions import ConfigurationError

from ..data.prompts import StopSequences, answer_text, eos_text, prompt_tokens
from ..model.decoding import cache_bytes_per_token, check_generation_config, eos_token_ids
from ..runtime.process_group import all_gather_objects, rank_and_world_size
from ..tasks.generation import SAMPLING_KEYS, Decoding, check_window, decoding_of
from .call import EvalOptions, GenerationSettings, ModelCall, agree_max
from .decoder import Row, decode_batch

logger = logging.getLogger(__name__)


def request_decodings(
    call: ModelCall, requests: Sequence[Any], settings: GenerationSettings
) -> list[Decoding]:
    """Each request's :class:`~tango_fairscale.tasks.generation.Decoding`, its stop sequences
    ending with the EOS text as lm-eval adds it; refused in one line (before any work): an engine
    that cannot generate, a model whose generation config changes greedy decoding, an unknown
    ``gen_kwargs`` key, a ``max_gen_toks`` beyond the model's window."""
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
    of at most ``options.batch_size`` prompts (:func:`batches_of`); the answers are gathered to
    every rank."""
    decodings = request_decodings(call, requests, settings)
    batches = my_batches(call, requests, decodings, options, settings)
    started = time.perf_counter()
    answers, generated = _decode_all(call, batches, decodings, options)
    parts = all_gather_objects((answers, generated))
    _log_rate(len(requests), sum(count for _, count in parts), time.perf_counter() - started)
    merged = {index: text for part, _ in parts for index, text in part.items()}
    return [merged[index] for index in range(len(requests))]


def my_batches(
    call: ModelCall,
    requests: Sequence[Any],
    decodings: Sequence[Decoding],
    options: EvalOptions,
    settings: GenerationSettings,
) -> list[tuple[Decoding, list[Row]]]:
    """This rank's share of the requests as batches: prompts encoded and left-truncated to the
    window less ``max_gen_toks``, longest first within each decoding, every ``W``-th for rank
    ``r`` of ``W``."""
    model = call.model
    rank, world_size = rank_and_world_size()
    budget = cache_token_budget(call)
    batches: list[tuple[Decoding, list[Row]]] = []
    for decoding, indices in _groups(decodings).items():
        contexts = [requests[i].args[0] for i in indices]
        prompts = prompt_tokens(model.tokenizer, contexts, model.max_length - decoding.max_gen_toks)
        order = sorted(range(len(indices)), key=lambda k: (-len(prompts[k]), indices[k]))
        rows = [
            Row(indices[k], prompts[k], _generator(decoding, settings.seed + indices[k], call))
            for k in order[rank::world_size]
        ]
        for batch in batches_of(rows, options.batch_size, budget, decoding.max_gen_toks):
            batches.append((decoding, batch))
    return batches


def batches_of(
    rows: list[Row], batch_size: int, token_budget: int | None, max_gen_toks: int
) -> list[list[Row]]:
    """``rows`` (longest prompt first) cut into batches of at most ``batch_size`` rows whose
    cache, ``rows x (longest prompt + max_gen_toks)`` tokens, fits ``token_budget``."""
    batches: list[list[Row]] = []
    for row in rows:
        width = (len(batches[-1][0].prompt) if batches else 0) + max_gen_toks
        full = not batches or len(batches[-1]) >= batch_size
        if not full and token_budget is not None:
            full = (len(batches[-1]) + 1) * width > token_budget
        if full:
            batches.append([row])
        else:
            batches[-1].append(row)
    return batches


def cache_token_budget(call: ModelCall) -> int | None:
    """On a GPU, the tokens whose key/value cache fills half the free memory (counted at 4
    bytes a value); ``None`` (no limit) elsewhere."""
    if call.device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(call.device)
    return max(1, int(free * 0.5) // cache_bytes_per_token(call.model.model, 4))


def _decode_all(
    call: ModelCall,
    batches: list[tuple[Decoding, list[Row]]],
    decodings: Sequence[Decoding],
    options: EvalOptions,
) -> tuple[dict[int, str], int]:
    """Decode this rank's batches in step with the other ranks' (as many slots on each, a rank
    out of batches idling): the answers by request index, and the tokens generated."""
    model = call.model
    rank, world_size = rank_and_world_size()
    slots = agree_max(len(batches), call.device)
    eos_ids = eos_token_ids(model.model)
    answers: dict[int, str] = {}
    started, generated = time.perf_counter(), 0
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
    return answers, generated


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
