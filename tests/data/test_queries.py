"""Encoding (context, continuation) pairs: a large batch tokenized in threads gives the ids of one
call."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from tango_fairscale.data import queries
from tango_fairscale.data.queries import encode_pairs, token_ids, usable_cpus


class _RecordingBackend:
    """The real backend tokenizer, recording the thread of each call."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.padding = backend.padding
        self.truncation = backend.truncation
        self.threads: list[str] = []

    def encode_batch_fast(self, *args: Any, **kwargs: Any) -> Any:
        self.threads.append(threading.current_thread().name)
        return self.backend.encode_batch_fast(*args, **kwargs)


class _Tokenizer:
    """The GPT-2 tokenizer with its backend recorded."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.backend_tokenizer = _RecordingBackend(tokenizer.backend_tokenizer)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tokenizer, name)


def test_a_large_batch_encodes_in_threads_to_the_same_ids(
    gpt2_tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(gpt2_tokenizer_dir)
    pairs = [
        (f"Question {i}: which of these {i % 7} things floats?\nAnswer:", f" the {word}")
        for i in range(40)
        for word in ("stone", "cork", "ship's hull", " leaf")
    ]
    texts = [context + continuation for context, continuation in pairs]
    alone = encode_pairs(tokenizer, pairs, max_length=1024)
    expected_ids = token_ids(tokenizer, texts)

    monkeypatch.setattr(queries, "TEXTS_PER_THREAD", 16)
    monkeypatch.setattr(queries, "usable_cpus", lambda: 4)
    recorded = _Tokenizer(tokenizer)
    assert encode_pairs(recorded, pairs, max_length=1024) == alone
    assert token_ids(recorded, texts) == expected_ids
    # The contexts (40) in two slices, the whole texts (160) in four, then token_ids' 160 in
    # four, each slice encoded in a pool's thread (the recording backend is not cut: it shows no
    # pipeline).
    threads = recorded.backend_tokenizer.threads
    assert len(threads) == 10 and all(name.startswith("tokenize") for name in threads)


def test_the_usable_cpus_are_counted_where_the_os_cannot_say(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert usable_cpus() >= 1
    monkeypatch.delattr(queries.os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(queries.os, "cpu_count", lambda: 3)
    assert usable_cpus() == 3
