"""Tango 1.3.2's console output without its noise (guarded; applied with the other Tango fixes).

* Before every step Tango records the installed packages with ``pkg_resources``, which setuptools
  80 deprecates with a ``UserWarning`` that Tango logs at each step (and setuptools 82 removed:
  "Error saving pip packages"). The same list is read with ``importlib.metadata`` instead
  (:func:`installed_packages`: pip's names, lower-cased, as ``pkg_resources`` keyed them).
* tqdm draws a finished bar twice, on its last update and again on ``close``; Tango's writer
  (``TqdmToLogsWriter``) prints and logs both where it cannot overwrite a line (a log file, a
  pipe, file-friendly logging): two ``Scoring: 100%`` lines. The repeat of a finished bar's
  line (the same description, bar and count) is dropped.
"""

from __future__ import annotations

import functools
import re
from typing import Any

#: A finished bar's display up to its count: ``Scoring: 100%|####| 128/128``.
_FINISHED = re.compile(r"^(?P<head>.*?100%\|[^|]*\|\s*\d+/\d+)\s\[")
_CURSOR_UP = "\x1b[A"


def installed_packages() -> list[tuple[str, str]]:
    """``(name, version)`` of each installed distribution, sorted, as Tango's
    ``get_pip_packages`` gave them (``pkg_resources``' keys: runs of other characters than
    letters, digits and dots as ``-``, lower case). Read once a process (every distribution's
    metadata file: ~0.2 s, which Tango asked for before each step)."""
    return list(_installed_packages())


@functools.cache
def _installed_packages() -> tuple[tuple[str, str], ...]:
    from importlib import metadata

    packages = set()
    for distribution in metadata.distributions():
        name = distribution.metadata["Name"]
        if name:
            packages.add((re.sub(r"[^A-Za-z0-9.]+", "-", name).lower(), distribution.version))
    return tuple(sorted(packages))


def patch_tango_package_list() -> None:
    """Make ``EnvironmentMetadata`` (whose dataclass ``__init__`` captured Tango's function as the
    default factory of ``packages``) list packages with :func:`installed_packages`."""
    from tango import step_info

    original = step_info.get_pip_packages
    step_info.get_pip_packages = installed_packages
    cells: Any = step_info.EnvironmentMetadata.__init__.__closure__ or ()
    for cell in cells:
        if cell.cell_contents is original:
            cell.cell_contents = installed_packages


def finished_bar(message: str) -> str | None:
    """A finished bar's display in ``message`` up to its count (:data:`_FINISHED`), or ``None``."""
    text = message.replace(_CURSOR_UP, "").strip("\r\n ")
    match = _FINISHED.match(text.rsplit("\r", 1)[-1])
    return None if match is None else match["head"]


def patch_tango_bar_repeats() -> None:
    """Make Tango's ``TqdmToLogsWriter`` (one per bar) drop a repeat of a finished bar's line."""
    from tango.common.tqdm import TqdmToLogsWriter

    original = TqdmToLogsWriter.write
    if getattr(original, "drops_repeats", False):
        return

    def write(self: Any, message: str) -> None:
        head = finished_bar(message)
        if head is not None:
            if head == getattr(self, "_finished_head", None):
                return
            self._finished_head = head
        original(self, message)

    write.drops_repeats = True  # type: ignore[attr-defined]
    TqdmToLogsWriter.write = write  # type: ignore[method-assign]


def apply() -> None:
    patch_tango_package_list()
    patch_tango_bar_repeats()
