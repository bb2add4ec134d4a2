"""A context's tokens reused for its continuations (``tango_fairscale.data.context_cuts``): every
pair encodes as its whole text does (lm-eval's way), also at the endings where a cut too close to
the end would not, and tokenizers of other kinds are encoded whole."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from tango_fairscale.data.context_cuts import context_cutter
from tango_fairscale.data.queries import pair_ids, token_ids

#: Pieces of text that end words in unusual ways: contractions, digit runs, whitespace of every
#: kind, letters beyond ASCII, the end-of-text token's text and its halves.
PIECES = [
    "'s", "'re", "'", "x", "re", "123", "4567", " ", "  ", "\n", "\t", "\u00a0", "é", "日本",
    "!", "?!", "<|endoftext|>", "<|endof", "text|>", " the", "The", "--", "...", " B", "'ll",
    "\u2019s", "😀", "0",
]  # fmt: skip


@pytest.fixture(scope="module")
def gpt2(gpt2_tokenizer_dir: Path):
    return AutoTokenizer.from_pretrained(gpt2_tokenizer_dir)


def whole_text_ids(tokenizer, context: str, continuation: str) -> tuple[list[int], int]:
    """lm-eval's HF backend's encoding of a pair: the whole text's tokens after the context's."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    context_ids = tokenizer(context)["input_ids"]
    whole = tokenizer(context + continuation)["input_ids"]
    return context_ids + whole[len(context_ids) :], len(context_ids)


def test_every_pair_encodes_as_its_whole_text(gpt2) -> None:
    rng = random.Random(0)
    pairs = []
    for _ in range(3000):
        context = "The quick brown fox jumps over the lazy dog" + "".join(
            rng.choice(PIECES) for _ in range(rng.randint(0, 8))
        )
        pairs.append((context, "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 4)))))
    expected = {pair: whole_text_ids(gpt2, *pair) for pair in pairs}
    pairs = [pair for pair, (ids, n) in expected.items() if len(ids) > n]  # a continuation
    assert pair_ids(gpt2, pairs) == [expected[pair] for pair in pairs]
    # ... and most of them through a cut, not whole.
    cutter = context_cutter(gpt2)
    assert cutter is not None
    contexts = list(dict.fromkeys(context for context, _ in pairs))
    cuts = cutter.cuts(contexts, token_ids(gpt2, contexts))
    assert sum(cut is not None for cut in cuts) > len(contexts) / 2


@pytest.mark.parametrize(
    ("context", "continuation", "inside_a_word"),
    [
        ("Is it yours? No, it is the x'r", "e mine and not yours, we all agree", True),  # 're
        ("They sailed a catamaran", "s and sloops home", True),  # cat|am|aran, cat|amar|ans
        ("We counted them all: 12", "345 of them, and more", False),  # one run of digits
        ("It said: the end<|endof", "text|> and more words after it", False),  # an added token
    ],
)
def test_a_cut_is_made_where_no_text_after_the_context_changes_the_words_before_it(
    gpt2, context: str, continuation: str, inside_a_word: bool
) -> None:
    expected = whole_text_ids(gpt2, context, continuation)
    assert pair_ids(gpt2, [(context, continuation)]) == [expected]
    if not inside_a_word:
        return
    # The cut is at a word's start (a space), where the rest encodes alone to the whole text's
    # tokens.
    whole = gpt2(context + continuation)["input_ids"]
    cutter = context_cutter(gpt2)
    assert cutter is not None
    context_ids = gpt2(context)["input_ids"]
    ((kept, characters),) = cutter.cuts([context], [context_ids])
    assert context[-characters] == " "
    rest = gpt2(context[-characters:] + continuation)["input_ids"]
    assert context_ids[:kept] + rest == whole
    # Cut before the context's last token instead, inside its last word, the tokens differ.
    last = len(gpt2.decode(context_ids[-1:]))
    rest = gpt2(context[-last:] + continuation)["input_ids"]
    assert context_ids[:-1] + rest != whole


def test_tokenizers_of_other_kinds_are_not_cut(gpt2, tmp_path: Path) -> None:
    from tokenizers import normalizers

    assert context_cutter(gpt2) is not None
    normalized = AutoTokenizer.from_pretrained(tmp_path_of(gpt2, tmp_path))
    normalized.backend_tokenizer.normalizer = normalizers.NFC()
    assert context_cutter(normalized) is None
    padded = AutoTokenizer.from_pretrained(tmp_path_of(gpt2, tmp_path))
    padded.backend_tokenizer.enable_padding()
    assert context_cutter(padded) is None
    pair = ("Which of these floats? A stone or a", " cork")
    assert pair_ids(normalized, [pair]) == [whole_text_ids(gpt2, *pair)]


def tmp_path_of(tokenizer, tmp_path: Path) -> Path:
    """``tokenizer`` saved under ``tmp_path`` (a copy to change)."""
    directory = tmp_path / "tokenizer"
    if not directory.exists():
        tokenizer.save_pretrained(directory)
    return directory
