"""Generation prompts and answers as lm-evaluation-harness's HF backend makes them: a prompt's
tokens (``tok_batch_encode``), when a generated row stops (its ``stop_sequences_criteria``) and the
answer's text (decoded without special tokens, cut at the first stop sequence)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from .. import compat  # noqa: F401  (the fixes; transformers' before it is imported)
from .queries import _encode


def prompt_tokens(
    tokenizer: Any, contexts: Sequence[str], max_prompt_length: int
) -> list[list[int]]:
    """Each context's tokens, the last ``max_prompt_length`` of them (left truncation): with the
    tokenizer's own special tokens, except for a context that starts with the BOS token's text.

    lm-eval decides the special tokens of a whole batch by its first context; here each context
    decides for itself, which is the same whenever a batch's contexts agree (they all start with
    BOS, as chat-templated prompts do, or none does)."""
    bos = getattr(tokenizer, "bos_token", None)
    plain = [bos is not None and context.startswith(bos) for context in contexts]
    result: list[list[int]] = [[] for _ in contexts]
    for flag in (False, True):
        indices = [i for i, value in enumerate(plain) if value is flag]
        encoded = _encode([contexts[i] for i in indices], tokenizer, not flag)
        for index, ids in zip(indices, encoded, strict=True):
            result[index] = list(ids[-max_prompt_length:]) if max_prompt_length > 0 else []
    for context, ids in zip(contexts, result, strict=True):
        if not ids:
            raise ValueError(f"generation prompt {context[:60]!r} encodes to no tokens")
    return result


class StopSequences:
    """lm-eval's ``MultiTokenEOSCriteria`` for each text of ``until``, row by row: a row stops
    once a text appears in the decoded last ``n + 2`` of its generated tokens (``n``: the text's
    own token count), special tokens decoded too.

    Each row's widest window is decoded first, and only rows where a stop text shows in it are
    decoded window by window: a text within a narrower window also shows in the wider one (a
    narrower window can only lose a leading space or cut a character into U+FFFD, which no stop
    text holds; one that does turns this shortcut off)."""

    def __init__(self, tokenizer: Any, until: Sequence[str]) -> None:
        self.decode = batch_decoder(tokenizer)
        self.texts = list(until)
        self.by_width: dict[int, list[str]] = defaultdict(list)
        for text in until:
            width = len(tokenizer.encode(text, add_special_tokens=False)) + 2
            self.by_width[width].append(text)
        self.widest = max(self.by_width, default=0)
        self.shortcut = not any("\ufffd" in text for text in until)

    def stopped(self, rows: Sequence[Sequence[int]]) -> list[bool]:
        """Whether each row of generated tokens has met a stop sequence at its last token."""
        result = [False] * len(rows)
        candidates = list(range(len(rows)))
        if self.shortcut and candidates:
            windows = self.decode([list(row[-self.widest :]) for row in rows])
            candidates = [i for i, window in enumerate(windows) if self._any_text(window)]
        if not candidates:
            return result
        for width, texts in self.by_width.items():
            windows = self.decode([list(rows[i][-width:]) for i in candidates])
            for index, window in zip(candidates, windows, strict=True):
                result[index] = result[index] or any(text in window for text in texts)
        return result

    def _any_text(self, window: str) -> bool:
        return any(text in window for text in self.texts)


def batch_decoder(tokenizer: Any) -> Any:
    """``tokenizer.batch_decode`` (special tokens kept), straight from a fast tokenizer's Rust
    backend where that gives the same texts (no clean-up of spaces, the base ``_decode``)."""
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    backend = getattr(tokenizer, "backend_tokenizer", None)
    same = (
        isinstance(tokenizer, TokenizersBackend)
        and type(tokenizer)._decode is TokenizersBackend._decode
        and not tokenizer.clean_up_tokenization_spaces
    )
    if backend is not None and same:
        return lambda rows: backend.decode_batch(rows, skip_special_tokens=False)
    return lambda rows: tokenizer.batch_decode(rows)


def answer_text(tokenizer: Any, tokens: Sequence[int], until: Sequence[str]) -> str:
    """A generated row's answer, as lm-eval's HF backend returns it: decoded without special
    tokens, cut before the first occurrence of any non-empty stop sequence."""
    from lm_eval.models.utils import postprocess_generated_text

    text = tokenizer.decode(list(tokens), skip_special_tokens=True)
    return str(postprocess_generated_text(generation=text, stop=list(until), think_end_token=None))


def eos_text(tokenizer: Any) -> str | None:
    """The end-of-text token's text, the stop sequence lm-eval adds to every request."""
    eos = tokenizer.eos_token_id
    return None if eos is None else str(tokenizer.decode(eos, skip_special_tokens=False))
