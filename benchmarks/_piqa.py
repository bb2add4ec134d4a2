"""PIQA as the benchmarks feed it: the official files, and lm-evaluation-harness's ``piqa`` prompts.

The prompts and the accuracy are defined here, not taken from the package's task code, so that a
benchmark's inputs stay the same while that code moves (a figure measured today compares with one
measured next month). They are lm-eval's ``piqa`` (the package's correctness definition): context
``"Question: {goal}\\nAnswer:"``, continuations ``" " + sol1`` and ``" " + sol2``; ``acc`` = the
choice with the larger summed log-likelihood, ``acc_norm`` = the larger log-likelihood per
character of the choice (no leading space); ties go to the first choice.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def examples(piqa_dir: Path, split: str, limit: int | None = None) -> list[dict[str, Any]]:
    """``train`` or ``validation`` examples (``goal``, ``sol1``, ``sol2``, ``label``) from the
    official release files, read by the package's reader."""
    from tango_fairscale.tasks.piqa import read_piqa

    return list(read_piqa(piqa_dir, limit=limit)[split])


def context(goal: str) -> str:
    return f"Question: {goal}\nAnswer:"


def choice_pairs(examples: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """Both choices of every example as (context, continuation), in order."""
    return [
        (context(example["goal"]), " " + example[choice])
        for example in examples
        for choice in ("sol1", "sol2")
    ]


def training_pairs(examples: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """The correct choice of every example (the fine-tuning objective)."""
    return [
        (context(example["goal"]), " " + example["sol2" if example["label"] == 1 else "sol1"])
        for example in examples
    ]


def loglikelihoods(scores: Sequence[Any]) -> list[float]:
    """``score_queries``' answers as floats (it returns log-likelihoods, or lm-eval's
    ``(log-likelihood, is greedy)`` pairs)."""
    return [float(s[0]) if isinstance(s, tuple | list) else float(s) for s in scores]


def accuracy(examples: Sequence[dict[str, Any]], scores: Sequence[float]) -> dict[str, float]:
    """``acc`` and ``acc_norm`` of the choices' log-likelihoods (in :func:`choice_pairs`' order)."""
    hits = hits_norm = 0
    for index, example in enumerate(examples):
        first, second = scores[2 * index], scores[2 * index + 1]
        hits += int((1 if second > first else 0) == example["label"])
        per_char = (first / len(example["sol1"]), second / len(example["sol2"]))
        hits_norm += int((1 if per_char[1] > per_char[0] else 0) == example["label"])
    n = max(1, len(examples))
    return {"acc": hits / n, "acc_norm": hits_norm / n}
