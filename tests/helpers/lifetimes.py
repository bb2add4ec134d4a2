"""Object lifetimes without Python's cyclic collector: what a test frees must be freed by
reference counting alone (a command's process collects cycles rarely:
``tango_fairscale/runtime/collector.py``)."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def reference_counting_only() -> Iterator[None]:
    """Inside: no cyclic garbage collection (what was garbage before is collected first)."""
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
