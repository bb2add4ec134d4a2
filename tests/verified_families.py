"""Tiny seeded models of the decoder families the package verifies (the README's list) and of
families it refuses, saved like hub checkpoints, and the plain Hugging Face scores they are
compared with (for tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from families import FAMILY_CONFIGS, VOCAB

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

#: The families of tests/families.py (every family the pipe splits) and more, dropout off.
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
    """A seeded random model of ``family`` saved like a hub checkpoint (fp32), with the GPT-2
    tokenizer's files; built with Hugging Face alone."""
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
