"""Benchmarks only, through ``sitecustomize.py``: each of the package's log-likelihood passes
(``ScorerLM._score``) under ``torch.profiler``, written to ``DIR/<pid>-<n>.txt``: the pass's wall
seconds, the GPU's kernel seconds within it, and the operators by own GPU and own CPU time.
:class:`PatchScorer` puts any such wrapper in place (``scoring_events.py`` has the other)."""

import os
import sys


def profiled(score, folder):  # type: ignore[no-untyped-def]
    import functools
    import time

    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    passes = [0]

    @functools.wraps(score)
    def wrapper(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        started = time.perf_counter()
        with profile(activities=activities) as profiler:
            result = score(self, *args, **kwargs)
        wall = time.perf_counter() - started
        events = profiler.key_averages()
        # The kernels' own time (the table's "Self CUDA time total"): operators' device time
        # would count each kernel a second time.
        kernel_s = (
            sum(
                e.self_device_time_total
                for e in events
                if e.device_type == DeviceType.CUDA and not e.is_user_annotation
            )
            / 1e6
        )
        passes[0] += 1
        lines = [
            f"# scoring pass {passes[0]} of process {os.getpid()}: {wall:.2f} s wall (profiled), "
            f"{kernel_s:.2f} s of GPU kernels (the GPU busy {100 * kernel_s / wall:.0f} % at most; "
            "the profiler slows the host, not the kernels)",
            events.table(sort_by="self_device_time_total", row_limit=20, max_name_column_width=60),
            events.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60),
        ]
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{os.getpid()}-{passes[0]}.txt")
        with open(path, "w") as file:
            file.write("\n".join(lines) + "\n")
        return result

    return wrapper


class PatchScorer:
    """A meta path finder that wraps ``ScorerLM._score`` once its module has been imported:
    ``ScorerLM._score = wrap(ScorerLM._score)``."""

    name = "tango_fairscale.evaluation.lm"

    def __init__(self, wrap) -> None:  # type: ignore[no-untyped-def]
        self.wrap = wrap

    def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):  # type: ignore[no-untyped-def]
            exec_module(module)
            module.ScorerLM._score = self.wrap(module.ScorerLM._score)

        spec.loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec
