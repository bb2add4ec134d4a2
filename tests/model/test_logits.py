"""The logit transforms a model's own forward applies after its head, reproduced by the fast loss
(model/logits.py, model/loss.py), and the probe at load that refuses what it does not reproduce.

* the scored-position loss through a transform (scale, soft cap) equals plain autograd of the
  transformed logits, in values and gradients, at large logits;
* RecurrentGemma's ``logits_soft_cap``, Falcon-H1's ``lm_head_multiplier`` and HyperCLOVA X's
  multiplying ``logits_scaling`` score like the model's own forward at large logits;
* a model whose forward changes its logits in a way no table knows is refused in one line, also
  when the change shows only at the model's own (small) logits.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.families import VERIFIED_FAMILIES, package_scores, reference_scores, save_family
from tango.common.exceptions import ConfigurationError

from tango_fairscale.model.causal_lm import ModelWrapper
from tango_fairscale.model.loss import LogitTransform, scored_row_nll


def test_training_gradients_through_the_transform_match_autograd() -> None:
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 100, bias=False)
    head.weight.data.mul_(40)  # logits in the hundreds: the cap bends them
    hidden = torch.randn(2, 5, 16, requires_grad=True)
    targets = torch.randint(0, 100, (2, 5))
    targets[0, :2] = -100
    transform = LogitTransform(scale=0.5, softcap=30.0)
    loss = scored_row_nll(head, hidden, targets, transform=transform)[0].mean()
    grads = torch.autograd.grad(loss, (hidden, head.weight))

    logits = 30.0 * torch.tanh(0.5 * head(hidden) / 30.0)
    nll = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), targets.flatten(), reduction="none"
    ).view(2, 5)
    scored = (targets != -100).float()
    expected = ((nll * scored).sum(1) / scored.sum(1)).mean()
    torch.testing.assert_close(loss, expected)
    for got, want in zip(grads, torch.autograd.grad(expected, (hidden, head.weight)), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


_LLAMA = VERIFIED_FAMILIES["llama"]
EXOTIC = {  # model_type: extra config, the transform its forward applies
    "recurrent_gemma": {"lru_width": 32, "attention_window_size": 128, "head_dim": 16,
                        "block_types": ["recurrent", "attention"], "logits_soft_cap": 30.0},
    "falcon_h1": {"lm_head_multiplier": 3.0, "mamba_d_ssm": 32, "mamba_n_heads": 4,
                  "mamba_d_head": 8, "mamba_n_groups": 1, "mamba_d_state": 16},
    "hyperclovax": {"logits_scaling": 4.0},
}  # fmt: skip


@pytest.mark.parametrize("model_type", sorted(EXOTIC))
def test_more_logit_transforms_are_reproduced(
    tmp_path: Path, tokenizer_dir: Path, piqa_small, model_type: str
) -> None:
    from conftest import choice_queries

    fields = {**_LLAMA, "model_type": model_type, **EXOTIC[model_type]}
    directory = save_family(tmp_path / model_type, "llama", tokenizer_dir, **fields)
    model = ModelWrapper(str(directory))
    with torch.no_grad():
        model.model.get_output_embeddings().weight.mul_(1000.0)
    queries = choice_queries(list(piqa_small["validation"])[:2], model.tokenizer, 128)
    expected = reference_scores(directory, queries, head_scale=1000.0)
    assert expected.abs().max() > 100
    got = package_scores(model, queries)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-4)


def _register_llama_variant(name: str, change) -> str:
    """A Llama class ``name`` whose own forward applies ``change`` to its logits; its model
    type."""
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    model_type = name.lower()
    config_class = type(f"{name}Config", (LlamaConfig,), {"model_type": model_type})

    def forward(self, *args, **kwargs):
        output = LlamaForCausalLM.forward(self, *args, **kwargs)
        output.logits = change(output.logits)
        return output

    model_class = type(
        name, (LlamaForCausalLM,), {"config_class": config_class, "forward": forward}
    )
    AutoConfig.register(model_type, config_class, exist_ok=True)
    AutoModelForCausalLM.register(config_class, model_class, exist_ok=True)
    return model_type


@pytest.mark.parametrize(
    "name, change",
    [
        ("DoubledLogitsLlama", lambda logits: logits * 2.0),
        # A bump at logits near 0: lost among large logits, seen only at the model's own.
        ("SmallLogitsLlama", lambda logits: logits + 0.1 * torch.exp(-logits.square())),
    ],
)
def test_an_unknown_logit_transform_is_refused_in_one_line(tokenizer_dir, name, change) -> None:
    config = {**_LLAMA, "model_type": _register_llama_variant(name, change)}
    with pytest.raises(ConfigurationError, match=f"{name} .* is not supported") as error:
        ModelWrapper(config=config, tokenizer=str(tokenizer_dir)).probe()
    assert "\n" not in str(error.value)
