"""Where a context's tokens may be reused for every continuation after it: for a byte-level BPE
tokenizer (GPT-2's), ``context + continuation`` encodes as the context's own tokens up to a cut
near its end, then the encoding of the rest of the text. The choices of a question then cost the
question's tokens once, not once per choice (MMLU-shaped pairs on two CPU cores: 1.3 s of
tokenizing instead of 4.5 s).

Why that is the whole text's encoding: such a tokenizer splits text into words with GPT-2's
regular expression, then merges bytes within a word only. A cut is made before a token that is a
space and a printable ASCII character. GPT-2's expression puts a space inside a word only at the
word's start (or in a word of whitespace only, which a printable character ends), so that space
starts a word whatever text comes after the context, and the words before it are found without
looking past the character after it: the whole text's words are the context's words before the
cut, then the words of the rest. The cut is made before the ``WORDS_AFTER_CUT``-th such token from
the end. It is made only where all of that holds: the pipeline is exactly that (no normalizer,
GPT-2's expression, BPE without dropout, a byte-level decoder, special tokens added at the start
only), the tokens after the cut decode to the context's last characters (a space first), and no
added token's text is in the context or within its reach of the continuation (added tokens are
split out of the whole text first). Anywhere else the caller encodes the whole text.
"""

from __future__ import annotations

import json
import re
import weakref
from collections.abc import Sequence
from typing import Any

#: Word-starting tokens a cut leaves after it in the context: one suffices (see the module
#: docstring); a second is a margin that costs a word's tokens.
WORDS_AFTER_CUT = 2

#: GPT-2's byte-to-character map writes a space as this character.
_SPACE = "\u0120"


class ContextCutter:
    """Cuts of contexts' tokens (:meth:`cuts`) and the test of a continuation (:meth:`fits`) for
    one tokenizer whose encoding allows them (:func:`context_cutter`)."""

    def __init__(self, backend: Any, word_starts: frozenset[int], added: Sequence[str]) -> None:
        self.backend = backend
        #: Ids of tokens that always start a word: a space, then printable ASCII.
        self.word_starts = word_starts
        self._added = re.compile("|".join(map(re.escape, added))) if added else None
        self._reach = max((len(text) for text in added), default=0)

    def cuts(
        self, contexts: Sequence[str], ids: Sequence[Sequence[int]]
    ) -> list[tuple[int, int] | None]:
        """For each context and its encoding, ``(tokens kept, characters after them)``: every
        continuation's whole text (:meth:`fits`) encodes as the kept tokens, then the encoding of
        the context's characters after them and the continuation. ``None`` where it cannot be
        cut."""
        kept = [None if self._holds_added(text) else self._cut(i) for text, i in zip(contexts, ids)]
        cut = [index for index, count in enumerate(kept) if count is not None]
        tails = self.backend.decode_batch(
            [list(ids[index][kept[index] :]) for index in cut], skip_special_tokens=False
        )
        found: list[tuple[int, int] | None] = [None] * len(contexts)
        for index, tail in zip(cut, tails, strict=True):
            count = kept[index]
            # A cut token decodes to a space and a character; else the context is encoded whole.
            if count is not None and tail[:1] == " " and contexts[index].endswith(tail):
                found[index] = (count, len(tail))
        return found

    def fits(self, context: str, continuation: str) -> bool:
        """Whether ``continuation`` holds no added token's text, nor one begun in ``context``."""
        if self._added is None:
            return True
        return self._added.search(context[len(context) - self._reach :] + continuation) is None

    def _holds_added(self, context: str) -> bool:
        return self._added is not None and self._added.search(context) is not None

    def _cut(self, context_ids: Sequence[int]) -> int | None:
        found = 0
        for index in range(len(context_ids) - 1, -1, -1):
            if context_ids[index] in self.word_starts:
                found += 1
                if found == WORDS_AFTER_CUT:
                    return index
        return None


def context_cutter(tokenizer: Any) -> ContextCutter | None:
    """The :class:`ContextCutter` of a fast tokenizer whose pipeline is GPT-2's (see the module
    docstring), else ``None``."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or backend.padding is not None or backend.truncation is not None:
        return None
    if not _is_gpt2_pipeline(backend):
        return None
    word_starts = _WORD_STARTS.get(backend)
    if word_starts is None:  # read once per tokenizer: its vocabulary does not change
        word_starts = _WORD_STARTS[backend] = frozenset(
            token_id
            for text, token_id in backend.get_vocab(with_added_tokens=False).items()
            if len(text) > 1 and text[0] == _SPACE and "!" <= text[1] <= "~"
        )
    added = [token.content for token in backend.get_added_tokens_decoder().values()]
    return ContextCutter(backend, word_starts, added)


#: The parts of a Rust tokenizer's pipeline read as JSON by :func:`_is_gpt2_pipeline`.
_PARTS = ("pre_tokenizer", "post_processor", "decoder")

#: Each tokenizer's word-starting token ids (:attr:`ContextCutter.word_starts`).
_WORD_STARTS: weakref.WeakKeyDictionary[Any, frozenset[int]] = weakref.WeakKeyDictionary()


def _is_gpt2_pipeline(backend: Any) -> bool:
    """Whether a Rust tokenizer encodes as GPT-2's does, word by word."""
    pre, post, decoder = (
        None if part is None else json.loads(part.__getstate__())
        for part in (getattr(backend, name, None) for name in _PARTS)
    )
    model = getattr(backend, "model", None)
    return (
        getattr(backend, "normalizer", 0) is None
        and pre is not None
        and pre.get("type") == "ByteLevel"
        and pre.get("use_regex") is True
        and pre.get("add_prefix_space") is False
        and type(model).__name__ == "BPE"
        and getattr(model, "dropout", 0) is None
        and decoder is not None
        and decoder.get("type") == "ByteLevel"
        and (post is None or post.get("type") == "ByteLevel" or _adds_at_start_only(post))
    )


def _adds_at_start_only(post: dict[str, Any]) -> bool:
    """A ``TemplateProcessing`` whose one-text template is special tokens, then the text."""
    single = post.get("single") if post.get("type") == "TemplateProcessing" else None
    if not single or "Sequence" not in single[-1]:
        return False
    return all("SpecialToken" in piece for piece in single[:-1])
