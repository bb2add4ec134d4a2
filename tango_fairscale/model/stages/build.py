"""The model cut into stages: the families the pipe splits (the table, one-line refusals), the
layers each stage gets (balance) and the tied LM head's mirror."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

import torch
from tango.common.exceptions import ConfigurationError
from torch import nn

from ... import compat  # noqa: F401  (the fixes; transformers' before it is imported)
from ..logits import logit_transform
from ..loss import LogitTransform
from . import gpt2, gpt_neox, llama, opt
from .family import Family
from .stage import MASKS, Projection, Stage, StagePrecision, StageSettings, TiedWeight

# Only for annotations: transformers' model code costs ~1 s to import; the model is given here.
if TYPE_CHECKING:
    from transformers import PreTrainedModel

#: model_type -> layout. SmolLM / SmolLM2 are "llama", Qwen2.5 is "qwen2".
FAMILIES: dict[str, Family] = {
    **gpt2.FAMILIES,
    **llama.FAMILIES,
    **gpt_neox.FAMILIES,
    **opt.FAMILIES,
}
SUPPORTED = ", ".join(sorted(FAMILIES))
OTHER_ENGINES = "use engine ddp, fairscale or fsdp2 for other models"


def family_of(model: PreTrainedModel) -> tuple[Family, Any]:
    """The family of a Hugging Face ``*ForCausalLM`` and its decoder module, or a one-line
    ``ConfigurationError`` naming the model type and the supported ones."""
    family = FAMILIES.get(str(getattr(model.config, "model_type", None)))
    if family is None:
        _refuse(model, "no stage layout for its family")
    try:
        decoder = family.decoder_of(model)
        family.embedding_modules(decoder)
        family.layer_list(decoder)
        family.final_modules(decoder)
        family.rotary_of(decoder)
        if model.get_output_embeddings() is None:
            raise AttributeError("no LM head")
        unknown = set(family.kinds(model.config)) - set(MASKS)
        reason = family.refuse(model, decoder)
        if unknown:
            reason = f"its layers use attention kinds {sorted(unknown)} with no stage mask"
    except AttributeError as error:
        reason = f"its modules are not laid out as this version expects ({error})"
    if reason is not None:
        _refuse(model, reason)
    return family, decoder


def _refuse(model: PreTrainedModel, reason: str) -> NoReturn:
    model_type = getattr(model.config, "model_type", None)
    raise ConfigurationError(
        f"the pipe engine cannot split {type(model).__name__} (model_type {model_type!r}): "
        f"{reason}; it splits model types {SUPPORTED}; {OTHER_ENGINES}"
    )


def num_layers(model: PreTrainedModel) -> int:
    """How many decoder layers the stages share (refuses models it cannot split)."""
    family, decoder = family_of(model)
    return len(family.layer_list(decoder))


def _numel(modules: Any) -> int:
    return sum(p.numel() for module in modules for p in module.parameters())


def auto_balance(model: PreTrainedModel, stages: int) -> list[int]:
    """Layers per stage, contiguous, at least one each, minimising the largest stage's parameter
    count (the embeddings count on the first stage, the final modules and LM head on the last;
    a tied head is mirrored there, so it costs memory too)."""
    family, decoder = family_of(model)
    head = model.get_output_embeddings()
    return partition(
        [_numel([layer]) for layer in family.layer_list(decoder)],
        stages,
        _numel(family.embedding_modules(decoder).values()),
        _numel(family.final_modules(decoder).values()) + _numel([head]),
    )


def partition(sizes: Sequence[int], stages: int, first: int = 0, last: int = 0) -> list[int]:
    """Cut ``sizes`` into ``stages`` contiguous non-empty parts minimising the largest part
    (``first`` / ``last`` are added to the first / last part). Dynamic programming, exact."""
    n = len(sizes)
    stages = max(1, min(stages, n))
    prefix = [0]
    for size in sizes:
        prefix.append(prefix[-1] + size)

    def cost(start: int, end: int, stage: int) -> int:
        extra = (first if stage == 0 else 0) + (last if stage == stages - 1 else 0)
        return prefix[end] - prefix[start] + extra

    infinity = float("inf")
    # best[k][i]: the smallest largest-part for the first i sizes in k parts; cut[k][i]: the
    # start of the k-th part.
    best = [[infinity] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0
    for k in range(1, stages + 1):
        for i in range(k, n - (stages - k) + 1):
            for j in range(k - 1, i):
                value = max(best[k - 1][j], cost(j, i, k - 1))
                if value < best[k][i]:
                    best[k][i], cut[k][i] = value, j
    balance: list[int] = []
    end = n
    for k in range(stages, 0, -1):
        start = cut[k][end]
        balance.append(end - start)
        end = start
    return balance[::-1]


@dataclass
class Stages:
    """One :class:`Stage` per partition (``Pipe`` gets ``balance=[1] * len(stages)``) and the
    tied weight to keep in step, if the LM head is tied to the input embedding."""

    stages: nn.Sequential
    tied: TiedWeight | None


def build_stages(
    model: PreTrainedModel,
    balance: Sequence[int],
    last_device: torch.device | None = None,
    precision: StagePrecision | None = None,
    transform: LogitTransform | None = None,
) -> Stages:
    """``model`` (a Hugging Face ``*ForCausalLM``) as stages of ``balance[i]`` layers each; a tied
    head computes with a mirror of the embedding on ``last_device`` (default: the CPU). The loss
    applies ``transform`` to the head's output (default: the one the model's config names, as
    ``ModelWrapper`` does)."""
    family, decoder = family_of(model)
    layers = family.layer_list(decoder)
    if sum(balance) != len(layers) or min(balance) < 1:
        raise ConfigurationError(
            f"balance {list(balance)} must be positive layer counts summing to {len(layers)}"
        )
    kinds = family.kinds(model.config)
    head = model.get_output_embeddings()
    embedding: Any = model.get_input_embeddings()
    tied: TiedWeight | None = None
    projection = head
    if head.weight is embedding.weight:
        if getattr(head, "bias", None) is not None:
            _refuse(model, "its LM head is tied to the embedding and has a bias")
        tied = TiedWeight(embedding.weight, last_device or torch.device("cpu"))
        projection = Projection(tied.mirror)
    settings = StageSettings(
        family,
        model.config,
        rotary=family.rotary_of(decoder),
        transform=transform or logit_transform(model.config),
        precision=precision or StagePrecision(),
    )
    stages = []
    start = 0
    for index, count in enumerate(balance):
        last = index == len(balance) - 1
        end = start + count
        stages.append(
            Stage(
                settings,
                layers[start:end],
                kinds[start:end],
                embeddings=family.embedding_modules(decoder) if index == 0 else None,
                final=family.final_modules(decoder) if last else None,
                head=projection if last else None,
            )
        )
        start = end
    sequential = nn.Sequential(*stages)
    _check_covered(model, sequential, tied)
    return Stages(sequential, tied)


def _check_covered(model: PreTrainedModel, stages: nn.Module, tied: TiedWeight | None) -> None:
    """Every parameter of the model must be in some stage (else the table misses a module)."""
    placed = {id(p) for p in stages.parameters()}
    missing = [
        name
        for name, p in model.named_parameters()
        if id(p) not in placed and not (tied is not None and p is tied.source)
    ]
    if missing:
        _refuse(model, f"parameters outside its stages ({', '.join(missing[:4])})")
