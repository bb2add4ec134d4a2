"""lm-evaluation-harness 0.4.13 without a Jinja compilation per prompt.

lm-eval renders each prompt field of a task (``doc_to_text``, ``doc_to_choice``,
``doc_to_target``) with ``lm_eval.utils.apply_template``, which compiles its template string anew
on every call (an open upstream issue). Building PIQA's 16,113 fine-tuning pairs took 11.8 s of a
``tango run``, nearly all compiling the same two templates (0.9 s with each compiled once), and
each in-loop validation spent a third of its time there.
:func:`compile_templates_once` makes lm-eval compile each template string once, in lm-eval's own
environment (its filters, ``StrictUndefined``): the rendered text is unchanged.
"""

from __future__ import annotations

import functools

#: Distinct template strings kept compiled (a task has a few; a process loads a few tasks).
TEMPLATES_KEPT = 1024


def compile_templates_once() -> None:
    """Replace ``lm_eval.utils.apply_template`` by one that compiles each template once (its
    ``compiled`` attribute: the ``functools.lru_cache``; ``original``: lm-eval's own)."""
    from lm_eval import utils

    original = utils.apply_template
    if getattr(original, "compiles_once", False):
        return
    compiled = functools.lru_cache(maxsize=TEMPLATES_KEPT)(utils.env.from_string)

    def apply_template(template: str, doc: dict) -> str:
        if not isinstance(template, str):  # what lm-eval does with it, error included
            return original(template, doc)
        return compiled(template).render(**doc)

    apply_template.compiles_once = True  # type: ignore[attr-defined]
    apply_template.compiled = compiled  # type: ignore[attr-defined]
    apply_template.original = original  # type: ignore[attr-defined]
    utils.apply_template = apply_template  # type: ignore[assignment]
