"""Tiny seeded models of every decoder family the package verifies, for tests.

``FAMILY_CONFIGS``: the families the pipe engine splits. Hidden size 32, 2 layers, 2 heads (one
key/value head where the family has grouped-query attention), 128 positions, the vocabulary of the
tests' tokenizer (``helpers/tokenizer.py``), dropout off, and each family's distinguishing feature
switched on: sliding windows of 8 tokens (shorter than PIQA rows), Gemma's scaled embeddings,
Gemma 2's logit soft cap, Gemma 3's per-kind rotary bases, SmolLM3's no-RoPE layer, GPT-NeoX's
partial rotary with a parallel residual, OPT-350m's ``project_in`` / ``project_out`` and
post-norm layers.
``VERIFIED_FAMILIES``: those and the rest of the README's list; ``REFUSED_FAMILIES``: families
refused at load. ``save_family`` builds one with Hugging Face alone, ``reference_scores`` scores it
with a plain Hugging Face forward, ``package_scores`` with the package's model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .tokenizer import VOCAB  # the tests' tokenizer's ids must fit

WINDOW = 8

#: A small decoder's shape; bos/eos: the tokenizer's end-of-text, as padding (where the tokenizer
#: files name none).
_SMALL: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 128,
    "bos_token_id": VOCAB - 1,
    "eos_token_id": VOCAB - 1,
}
_ROPE: dict[str, Any] = {**_SMALL, "attention_dropout": 0.0}
_GEMMA: dict[str, Any] = {**_ROPE, "head_dim": 16, "query_pre_attn_scalar": 16}

FAMILY_CONFIGS: dict[str, dict[str, Any]] = {
    "gpt2": {
        "model_type": "gpt2",
        "vocab_size": VOCAB,
        "bos_token_id": VOCAB - 1,
        "eos_token_id": VOCAB - 1,
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


#: The families of FAMILY_CONFIGS (every family the pipe splits) and more, dropout off.
VERIFIED_FAMILIES: dict[str, dict[str, Any]] = {
    **FAMILY_CONFIGS,
    "mixtral": {"model_type": "mixtral", **_SMALL, "num_local_experts": 4,
                "num_experts_per_tok": 2},
    "qwen2_moe": {"model_type": "qwen2_moe", **_SMALL, "moe_intermediate_size": 32,
                  "shared_expert_intermediate_size": 32, "num_experts": 4,
                  "num_experts_per_tok": 2},
    "cohere": {"model_type": "cohere", **_SMALL, "logit_scale": 0.0625},
    "granite": {"model_type": "granite", **_SMALL, "logits_scaling": 8.0},
    "phi": {"model_type": "phi", **_SMALL, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
            "attention_dropout": 0.0},
    "phi3": {"model_type": "phi3", **_SMALL, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
             "attention_dropout": 0.0, "pad_token_id": VOCAB - 1},
    "stablelm": {"model_type": "stablelm", **_SMALL, "hidden_dropout": 0.0,
                 "attention_dropout": 0.0},
    "olmo2": {"model_type": "olmo2", **_SMALL},
    "starcoder2": {"model_type": "starcoder2", **_SMALL, "residual_dropout": 0.0,
                   "embedding_dropout": 0.0, "attention_dropout": 0.0},
    "falcon": {"model_type": "falcon", "vocab_size": VOCAB, "hidden_size": 32,
               "num_hidden_layers": 2, "num_attention_heads": 2, "multi_query": True,
               "new_decoder_architecture": False, "alibi": False, "hidden_dropout": 0.0,
               "attention_dropout": 0.0, "bos_token_id": VOCAB - 1, "eos_token_id": VOCAB - 1},
    "bloom": {"model_type": "bloom", "vocab_size": VOCAB, "hidden_size": 32, "n_layer": 2,
              "n_head": 2, "hidden_dropout": 0.0, "attention_dropout": 0.0,
              "bos_token_id": VOCAB - 1, "eos_token_id": VOCAB - 1},
    "gptj": {"model_type": "gptj", "vocab_size": VOCAB, "n_embd": 32, "n_layer": 2, "n_head": 2,
             "n_positions": 128, "rotary_dim": 8, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
             "attn_pdrop": 0.0, "bos_token_id": VOCAB - 1, "eos_token_id": VOCAB - 1},
    "gpt_neo": {"model_type": "gpt_neo", "vocab_size": VOCAB, "hidden_size": 32,
                "num_layers": 2, "num_heads": 2, "attention_types": [[["global", "local"], 1]],
                "max_position_embeddings": 128, "window_size": 64, "resid_dropout": 0.0,
                "embed_dropout": 0.0, "attention_dropout": 0.0, "bos_token_id": VOCAB - 1,
                "eos_token_id": VOCAB - 1},
}  # fmt: skip

#: Families refused at load: their logits are not the head's output through a known transform.
REFUSED_FAMILIES: dict[str, dict[str, Any]] = {
    "xlstm": {"model_type": "xlstm", "vocab_size": VOCAB, "hidden_size": 32,
              "embedding_dim": 32, "num_blocks": 2, "num_heads": 2,
              "output_logit_soft_cap": 15.0},
    "bert": {"model_type": "bert", **_SMALL, "is_decoder": True, "pad_token_id": VOCAB - 1},
    "modernbert-decoder": {"model_type": "modernbert-decoder", **_SMALL,
                           "pad_token_id": VOCAB - 1},
}  # fmt: skip


def save_family(
    directory: Path, family: str, tokenizer_dir: Path, seed: int = 0, **overrides: Any
) -> Path:
    """A seeded random model of ``family`` saved like a hub checkpoint (fp32), with the files of the
    tokenizer in ``tokenizer_dir``; built with Hugging Face alone."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    fields = {**VERIFIED_FAMILIES.get(family, {}), **REFUSED_FAMILIES.get(family, {})}
    fields.update(overrides)
    model_type = fields.pop("model_type")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **fields))
    model.save_pretrained(directory)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(directory)
    return directory


def reference_scores(model_dir: Path, queries, head_scale: float = 1.0) -> torch.Tensor:
    """Each query's summed continuation log-probability by a plain Hugging Face full forward of
    ``model_dir`` in fp32, one unpadded row per query, its head's weight times ``head_scale``."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    scores = []
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(head_scale)
        for query in queries:
            logits = model(input_ids=torch.tensor([query.tokens]), use_cache=False).logits[0]
            log_probs = logits.float().log_softmax(-1)
            n, c = len(query.tokens), query.continuation_length
            scores.append(sum(log_probs[t - 1, query.tokens[t]].item() for t in range(n - c, n)))
    return torch.tensor(scores, dtype=torch.float64)


def package_scores(model: Any, queries, packed: bool = False) -> torch.Tensor:
    from tango_fairscale.data.batches import collate, packed_batch

    make = packed_batch if packed else collate
    with torch.no_grad():
        return model.eval()(**make(queries, model.pad_token_id))["loglikelihood"].double()
