"""Python's cyclic garbage collector in a command's main process (``tango run``, ``tango-fairscale
eval``): what the process holds once its libraries are imported is left out of later collections,
and the collections come less often.

An evaluation command holds millions of small objects that live until it ends (documents,
requests, answers, samples, JSON read back) and makes almost no reference cycles. With Python's
default thresholds (700, 10, 10) the collector traversed all of them again and again: on 2 cores,
1.2 s of a PIQA evaluation-only command (8 full collections) and 3.8 s of the 52,000-request
synthetic suite's second model (14 full collections). Frozen and collected at
:data:`THRESHOLDS`: 0.3 s and 1.1 s, the same peak memory (2.2 GB). One device's training runs
in this process too (several devices' in workers, which keep Python's defaults): 1.3 s of
collections in 200 steps of a tiny model, 0.4 s now; the engine it trained with is held in
reference cycles, collected when the run returns (:func:`collect_cycles`). An evaluation step's
lm-eval task (its documents, requests and answers) is in no reference cycle, so it goes when the
step returns, not at the next full collection (:mod:`~tango_fairscale.tasks.task_methods`,
``tests/evaluation/test_steps.py``).
"""

from __future__ import annotations

import gc

#: New objects between collections of the youngest generation, and collections of a generation
#: between two of the next (Python's defaults: 700, 10, 10).
THRESHOLDS = (50_000, 20, 20)


def collect_less() -> None:
    """Leave every object alive now out of later collections (``gc.freeze``: torch's and Tango's
    modules, imported by then) and collect at :data:`THRESHOLDS`. For a command's main process:
    call after its heavy imports (``eval`` of several models: again before each model's run,
    right after the last one's objects were collected)."""
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)


def collect_cycles() -> None:
    """Free what reference cycles hold now (a trained engine's model on the device), where this
    process collects less (:func:`collect_less`: the collection skips the frozen imports, ~0.1 s);
    elsewhere Python's own thresholds collect soon enough (and a full collection of a large
    process, a test session's, costs 0.3 s)."""
    if gc.get_threshold() == THRESHOLDS:
        gc.collect()
