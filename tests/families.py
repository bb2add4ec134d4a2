"""Tiny, seeded configs of every decoder family the pipe engine splits, for tests.

Hidden size 32, 2 layers, 2 heads (one key/value head where the family has grouped-query
attention), 128 positions, the GPT-2 tokenizer's vocabulary, dropout off, and each family's
distinguishing feature switched on: sliding windows of 8 tokens (shorter than PIQA rows), Gemma's
scaled embeddings, Gemma 2's logit soft cap, Gemma 3's per-kind rotary bases, SmolLM3's no-RoPE
layer, GPT-NeoX's partial rotary with a parallel residual, OPT-350m's ``project_in`` /
``project_out`` and post-norm layers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

VOCAB = 50257  # the GPT-2 tokenizer's ids must fit
WINDOW = 8

_ROPE: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 128,
    "attention_dropout": 0.0,
    # The GPT-2 tokenizer's end-of-text, as padding (where the tokenizer files name none).
    "bos_token_id": VOCAB - 1,
    "eos_token_id": VOCAB - 1,
}
_GEMMA: dict[str, Any] = {**_ROPE, "head_dim": 16, "query_pre_attn_scalar": 16}

FAMILY_CONFIGS: dict[str, dict[str, Any]] = {
    "gpt2": {
        "model_type": "gpt2",
        "n_layer": 2,
        "n_embd": 32,
        "n_head": 2,
        "n_positions": 128,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
    },
    # SmolLM / SmolLM2's layout: a Llama with tied embeddings.
    "llama": {"model_type": "llama", **_ROPE, "tie_word_embeddings": True},
    "mistral": {"model_type": "mistral", **_ROPE, "sliding_window": WINDOW},
    # Layer 0 full attention, layer 1 a sliding window.
    "qwen2": {
        "model_type": "qwen2",
        **_ROPE,
        "use_sliding_window": True,
        "sliding_window": WINDOW,
        "max_window_layers": 1,
        "tie_word_embeddings": True,
    },
    "qwen3": {
        "model_type": "qwen3",
        **_ROPE,
        "head_dim": 16,
        "use_sliding_window": True,
        "sliding_window": WINDOW,
        "max_window_layers": 1,
    },
    # Layer 1 has no rotary embedding (NoPE).
    "smollm3": {
        "model_type": "smollm3",
        **_ROPE,
        "no_rope_layers": [1, 0],
        "pad_token_id": VOCAB - 1,  # its default is outside this vocabulary
    },
    "gemma": {"model_type": "gemma", **_GEMMA},
    "gemma2": {
        "model_type": "gemma2",
        **_GEMMA,
        "sliding_window": WINDOW,
        "layer_types": ["sliding_attention", "full_attention"],
        "final_logit_softcapping": 30.0,
        "attn_logit_softcapping": 50.0,
    },
    "gemma3_text": {
        "model_type": "gemma3_text",
        **_GEMMA,
        "sliding_window": WINDOW,
        "layer_types": ["sliding_attention", "full_attention"],
    },
    "gpt_neox": {
        "model_type": "gpt_neox",
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "max_position_embeddings": 128,
        "rotary_pct": 0.25,
        "use_parallel_residual": True,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
    },
    "opt": {
        "model_type": "opt",
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "ffn_dim": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "max_position_embeddings": 128,
        "word_embed_proj_dim": 16,
        "do_layer_norm_before": False,
        "dropout": 0.0,
        "attention_dropout": 0.0,
        "activation_dropout": 0.0,
        "layerdrop": 0.0,
    },
}


def tiny_model(name: str, tokenizer_dir: Path, seed: int = 1, **overrides: Any) -> Any:
    """A seeded, randomly initialised ``ModelWrapper`` of family ``name``."""
    from tango_fairscale.model.causal_lm import ModelWrapper

    config = {**FAMILY_CONFIGS[name], **overrides}
    return ModelWrapper(config=config, tokenizer=str(tokenizer_dir), seed=seed)


def save_tiny_model(name: str, directory: Path, tokenizer_dir: Path, **overrides: Any) -> Path:
    """:func:`tiny_model` saved like a hub checkpoint."""
    tiny_model(name, tokenizer_dir, **overrides).save(directory)
    return directory
