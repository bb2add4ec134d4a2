"""What a model's own forward does to ``lm_head(hidden)``, so that the fast loss does the same,
and a probe that refuses at load a model whose log-likelihoods the fast path does not reproduce."""

from __future__ import annotations

from typing import Any

import torch
from tango.common.exceptions import ConfigurationError

from .loss import LogitTransform, scored_row_nll

#: Config fields of the logit transforms the fast loss applies (on the config or its
#: ``text_config``): Gemma-2/3's soft cap, Cohere's multiplier, Granite's divisor.
KNOWN_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")

#: The probe's logits are scaled to about this size, where a soft cap (say at 30) bends them.
PROBE_LOGIT_SCALE = 40.0


def logit_transform(config: Any) -> LogitTransform:
    """The :class:`LogitTransform` a Hugging Face config's model applies to its head's output."""
    fields = getattr(config, "text_config", None) or config
    softcap = getattr(fields, "final_logit_softcapping", None)
    scale = getattr(fields, "logit_scale", None) or 1.0
    divisor = getattr(fields, "logits_scaling", None)
    if divisor:
        scale = scale / divisor
    return LogitTransform(scale=float(scale), softcap=None if not softcap else float(softcap))


def check_fast_path(model: Any, transform: LogitTransform, vocab_size: int) -> None:
    """Refuse ``model`` (a ``*ForCausalLM``) unless the fast path — its base model's hidden
    states, projected by its output embeddings at scored positions, through ``transform`` —
    gives the same log-likelihoods as its own forward, on a probe batch whose hidden states are
    scaled so that the logits are large (a soft cap or a multiplier shows there). Runs on the
    model's device and dtype, in evaluation mode, without gradients."""
    head = model.get_output_embeddings()
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, vocab_size, (2, 12), generator=generator, device="cpu")
    input_ids = input_ids.to(device)
    targets = input_ids[:, 1:]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            hidden = model.base_model(input_ids=input_ids[:, :-1], use_cache=False)[0]
            logits = torch.nn.functional.linear(hidden, head.weight, getattr(head, "bias", None))
            factor = PROBE_LOGIT_SCALE / float(logits.float().std().clamp(min=1e-6))
            ours = -scored_row_nll(head, hidden * factor, targets, transform=transform)[1]
            handle = head.register_forward_pre_hook(lambda _, args: (args[0] * factor,))
            try:
                own_logits = model(input_ids=input_ids[:, :-1], use_cache=False).logits
            finally:
                handle.remove()
            own = own_logits.float().log_softmax(-1).gather(-1, targets[..., None])[..., 0].sum(1)
    finally:
        model.train(was_training)
    difference = float((ours - own).abs().max())
    if not difference <= 1e-4 * float(own.abs().max()) + 1e-3:
        config = model.config
        raise ConfigurationError(
            f"{type(model).__name__} (model_type {getattr(config, 'model_type', None)!r}) "
            "computes its logits in a way the package's scorer does not reproduce: on a probe "
            f"batch the log-likelihoods differ by {difference:.3g} (the scorer applies "
            f"{', '.join(KNOWN_TRANSFORMS)}); this model is not supported"
        )
