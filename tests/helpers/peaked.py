"""Tiny seeded models whose next-token distributions are peaked, for comparing generated text.

A randomly initialised tiny model has near-uniform logits, where float noise (another batch
shape, left padding) can flip an argmax; and with the usual 0.02 init it repeats one token
forever. These are initialised at a larger scale, and the output rows of a few common tokens
(words, digits, punctuation, newlines, the end of text: the tasks' stop sequences among them)
are scaled up: greedy decoding then picks among those tokens by clear margins (median gap
between the top two logits about 2, smallest seen about 0.01 against float noise near 1e-6) and
writes varied text that meets stop sequences and ends with EOS at varied points.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

#: Tokens whose output rows are boosted (their first GPT-2 token each).
BOOSTED = [" the", " answer", " is", ".", ",", "\n", " Q", ":", " 1", "2", " 3", "4", " The",
           " of", " and", " Question", "####", " é", " 字", "<|endoftext|>", " A", " so", " 5",
           "0", " cat", " blue", " Paris", "\n\n"]  # fmt: skip

SHAPES: dict[str, dict[str, Any]] = {
    # GPT-2 with its own output layer (a tied one keeps repeating its input token).
    "gpt2": {"model_type": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 2, "n_positions": 128,
             "tie_word_embeddings": False},
    # A Llama whose output layer is its input embedding.
    "llama": {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
              "max_position_embeddings": 128, "tie_word_embeddings": True},
}  # fmt: skip


def save_peaked_model(directory: Path, tokenizer_dir: Path, family: str) -> Path:
    """A seeded tiny ``family`` model (``SHAPES``) with GPT-2's own tokenizer, which names its
    BOS/EOS (lm-eval needs them), saved like a hub checkpoint; its config's BOS/EOS are the
    tokenizer's end of text."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tokenizer.eos_token = tokenizer.bos_token = "<|endoftext|>"
    shape = dict(SHAPES[family])
    end = tokenizer.eos_token_id
    config = AutoConfig.for_model(
        shape.pop("model_type"),
        vocab_size=len(tokenizer),
        initializer_range=0.5,
        bos_token_id=end,
        eos_token_id=end,
        **shape,
    )
    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(config)
    boosted = sorted({tokenizer.encode(text)[0] for text in BOOSTED})
    with torch.no_grad():
        model.get_output_embeddings().weight[boosted] *= 3.0
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
