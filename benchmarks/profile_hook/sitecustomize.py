"""Benchmarks only: with ``BENCH_CPROFILE_DIR`` set, every Python process started with this folder
on ``PYTHONPATH`` (the user's command and the training workers it spawns) runs under ``cProfile``
and writes ``DIR/<pid>.prof`` when it exits; ``benchmarks/profile_summary.py DIR`` reads them.
With ``BENCH_SCORING_PROFILE_DIR`` set, each of the package's log-likelihood passes runs under
``torch.profiler`` (``scoring_profile.py``); with ``BENCH_SCORING_EVENTS_DIR``, timed forward by
forward with CUDA events instead (``scoring_events.py``)."""

import os
import sys

if os.environ.get("BENCH_SCORING_PROFILE_DIR"):
    from scoring_profile import PatchScorer, profiled

    _folder = os.environ["BENCH_SCORING_PROFILE_DIR"]
    sys.meta_path.insert(0, PatchScorer(lambda score: profiled(score, _folder)))
elif os.environ.get("BENCH_SCORING_EVENTS_DIR"):
    from scoring_events import evented
    from scoring_profile import PatchScorer

    _folder = os.environ["BENCH_SCORING_EVENTS_DIR"]
    sys.meta_path.insert(0, PatchScorer(lambda score: evented(score, _folder)))

_PROFILE_DIR = os.environ.get("BENCH_CPROFILE_DIR")
if _PROFILE_DIR:
    import atexit
    import cProfile

    _profiler = cProfile.Profile()
    _profiler.enable()

    def _write_profile(folder: str = _PROFILE_DIR) -> None:
        _profiler.disable()
        os.makedirs(folder, exist_ok=True)
        _profiler.dump_stats(os.path.join(folder, f"{os.getpid()}.prof"))

    atexit.register(_write_profile)
