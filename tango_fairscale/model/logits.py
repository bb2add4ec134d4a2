"""What a model's own forward does to ``lm_head(hidden)``, so that the fast loss does the same,
and a probe that refuses at load a model whose log-likelihoods the fast path does not reproduce."""

from __future__ import annotations

from typing import Any

import torch
from tango.common.exceptions import ConfigurationError

from .loss import LogitTransform, scored_row_nll

#: Config fields of the logit transforms the fast loss applies (on the config or its
#: ``text_config``): Gemma-2/3's and RecurrentGemma's soft caps, Cohere's multiplier, Falcon-H1's
#: head multiplier, Granite's and MiniCPM3's divisor (HyperCLOVA X's multiplier).
KNOWN_TRANSFORMS = (
    "final_logit_softcapping",
    "logits_soft_cap",
    "logit_scale",
    "lm_head_multiplier",
    "logits_scaling",
)

#: The probe's logits are scaled to about this size, where a soft cap (say at 30) bends them.
PROBE_LOGIT_SCALE = 40.0

#: Model types whose ``logits_scaling`` multiplies the logits (everywhere else it divides them).
MULTIPLYING_LOGITS_SCALING = ("hyperclovax",)


def logit_transform(config: Any) -> LogitTransform:
    """The :class:`LogitTransform` a Hugging Face config's model applies to its head's output."""
    fields = getattr(config, "text_config", None) or config
    softcap = getattr(fields, "final_logit_softcapping", None) or getattr(
        fields, "logits_soft_cap", None
    )
    scale = float(getattr(fields, "logit_scale", None) or 1.0)
    scale *= float(getattr(fields, "lm_head_multiplier", None) or 1.0)
    scaling = getattr(fields, "logits_scaling", None)
    if scaling:
        multiplies = getattr(fields, "model_type", None) in MULTIPLYING_LOGITS_SCALING
        scale = scale * scaling if multiplies else scale / scaling
    return LogitTransform(scale=float(scale), softcap=None if not softcap else float(softcap))


def check_fast_path(model: Any, transform: LogitTransform, vocab_size: int) -> None:
    """Refuse ``model`` (a ``*ForCausalLM``) unless the fast path — its base model's hidden
    states, projected by its output embeddings at scored positions, through ``transform`` —
    gives the same log-likelihoods as its own forward on a probe batch: at the model's own
    logits (to 1e-5 relative in fp32), and with its head's input scaled so that the logits are
    large (a soft cap or a multiplier shows there; to 1e-4). Runs on the model's device and
    dtype, in evaluation mode, without gradients."""
    head = model.get_output_embeddings()
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, vocab_size, (2, 12), generator=generator, device="cpu")
    input_ids = input_ids.to(device)
    fp32 = next(model.parameters()).dtype == torch.float32
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            hidden = model.base_model(input_ids=input_ids[:, :-1], use_cache=False)[0]
            logits = torch.nn.functional.linear(hidden, head.weight, getattr(head, "bias", None))
            large = PROBE_LOGIT_SCALE / float(logits.float().std().clamp(min=1e-6))
            passes = (("its own", 1.0, 1e-5 if fp32 else 2e-2), ("large", large, 1e-4))
            for where, factor, rtol in passes:
                scaled = hidden * factor
                ours = -scored_row_nll(head, scaled, input_ids[:, 1:], transform=transform)[1]
                own = _own_log_likelihoods(model, head, input_ids, factor)
                difference = float((ours - own).abs().max())
                if not difference <= rtol * float(own.abs().max()) + 1e-3:
                    raise ConfigurationError(
                        f"{type(model).__name__} (model_type "
                        f"{getattr(model.config, 'model_type', None)!r}) computes its logits in "
                        "a way the package's scorer does not reproduce: on a probe batch the "
                        f"log-likelihoods at {where} logits differ by {difference:.3g} (the "
                        f"scorer applies {', '.join(KNOWN_TRANSFORMS)}); this model is not "
                        "supported"
                    )
    finally:
        model.train(was_training)


def _own_log_likelihoods(
    model: Any, head: torch.nn.Module, input_ids: torch.Tensor, factor: float
) -> torch.Tensor:
    """Each row's summed log-probability of its tokens after the first by the model's own
    forward, its head's input multiplied by ``factor``."""
    handle = None
    if factor != 1.0:
        handle = head.register_forward_pre_hook(lambda _, args: (args[0] * factor,))
    try:
        logits = model(input_ids=input_ids[:, :-1], use_cache=False).logits
    finally:
        if handle is not None:
            handle.remove()
    log_probs = logits.float().log_softmax(-1)
    return log_probs.gather(-1, input_ids[:, 1:, None])[..., 0].sum(1)
