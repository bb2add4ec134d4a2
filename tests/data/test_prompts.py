"""Generation prompts and stops as lm-eval's HF backend makes them: prompt tokens equal its
``tok_batch_encode`` (special tokens, left truncation), a row stops where its
``stop_sequences_criteria`` stops it, and the fast window decoder equals ``batch_decode``."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from tango_fairscale.data.prompts import StopSequences, batch_decoder, prompt_tokens

CONTEXTS = [
    "Question: What is 2+2?\nAnswer:",
    "Q: 数字は何ですか? Ça va ? 🍵\nA:",
    "word " * 300,  # longer than the window: left-truncated
    "<|endoftext|>Already starts with the BOS text",
    " leading space and trailing space ",
]


@pytest.mark.parametrize("max_prompt_length", [100, 7])
def test_prompt_tokens_equal_lm_evals_tok_batch_encode(hflm: Any, max_prompt_length: int) -> None:
    ours = prompt_tokens(hflm.tokenizer, CONTEXTS, max_prompt_length)
    for context, ids in zip(CONTEXTS, ours, strict=True):
        theirs, _ = hflm.tok_batch_encode([context], left_truncate_len=max_prompt_length)
        assert ids == theirs[0].tolist(), context


def test_a_bos_tokenizer_adds_bos_unless_the_context_has_it(gpt2_tokenizer_dir: Path) -> None:
    """As lm-eval's ``tok_batch_encode`` on a batch of such contexts (a chat template's, say)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        str(gpt2_tokenizer_dir), bos_token="<|endoftext|>", add_bos_token=True
    )
    assert tokenizer("a b")["input_ids"] == [50256, 64, 275]  # the tokenizer adds BOS
    plain, prefixed = prompt_tokens(tokenizer, ["a b", "<|endoftext|>a b"], 50)
    assert plain == prefixed == [50256, 64, 275]


def test_an_empty_prompt_is_refused(hflm: Any) -> None:
    with pytest.raises(ValueError, match="encodes to no tokens"):
        prompt_tokens(hflm.tokenizer, [""], 10)


STOPS = ["\n", ".", "Question:", "</s>", "<|endoftext|>", "\n\n", "Q", " the answer"]


def lm_eval_stopped(tokenizer: Any, prompt: list[int], generated: list[int], stop: str) -> bool:
    """lm-eval's criterion for one stop text, batch of one, after ``generated``."""
    from lm_eval.models.utils_hf import stop_sequences_criteria

    criteria = stop_sequences_criteria(tokenizer, [stop], len(prompt), 1)
    return bool(criteria[0](torch.tensor([prompt + generated]), None))


def test_rows_stop_where_lm_evals_criteria_stop_them(hflm: Any) -> None:
    tokenizer = hflm.tokenizer
    rng = random.Random(0)
    pieces = ["\n", ".", " Question", ":", "Question", "</", "s", ">", " the", " answer", "Q",
              "<|endoftext|>", " é", "字", " word", "\n\n", " 2"]  # fmt: skip
    vocabulary = [tokenizer.encode(piece)[0] for piece in pieces] + list(range(300, 340))
    stops = StopSequences(tokenizer, STOPS)
    prompt = tokenizer.encode("Q: a question\nA:")
    checked = 0
    for _ in range(40):
        generated = [rng.choice(vocabulary) for _ in range(12)]
        for k in range(1, len(generated) + 1):
            ours = stops.stopped([generated[:k]])[0]
            theirs = any(lm_eval_stopped(tokenizer, prompt, generated[:k], s) for s in STOPS)
            assert ours == theirs, tokenizer.decode(generated[:k])
            checked += ours
    assert checked > 40  # the stops were met, at many places


@pytest.mark.parametrize("which", ["gpt2", "small"])
def test_the_window_decoder_equals_batch_decode(
    which: str, gpt2_tokenizer_dir: Path, tokenizer_dir: Path
) -> None:
    from transformers import AutoTokenizer

    directory = gpt2_tokenizer_dir if which == "gpt2" else tokenizer_dir
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    rng = random.Random(1)
    size = len(tokenizer)
    rows = [[rng.randrange(size) for _ in range(rng.randint(0, 6))] for _ in range(300)]
    rows.append([size - 1, 198, size - 1])
    assert batch_decoder(tokenizer)(rows) == tokenizer.batch_decode(rows)
