"""Tango's step infos without Tango: :class:`StepRecord` and the unpickler of ``stepinfo.sqlite``.

The unpickler maps Tango's ``StepInfo`` and its metadata classes to stand-ins that only hold
attributes (or, for :mod:`tango_fairscale.compat.tango_workspace`, to Tango's own classes),
datetimes and paths to their (pure) standard-library types, and refuses every other global, so
nothing a pickle names is imported or executed.
"""

from __future__ import annotations

import datetime as dt
import io
import pathlib
import pickle
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ALLOWED_GLOBALS", "RefusedGlobal", "StepRecord", "load_step_info", "record"]


@dataclass(frozen=True)
class StepRecord:
    """A step's ``StepInfo`` as Tango last recorded it (times are timezone-aware, UTC)."""

    name: str
    unique_id: str
    step_class_name: str | None = None
    cacheable: bool = True
    version: str | None = None
    start_time: dt.datetime | None = None
    end_time: dt.datetime | None = None
    error: str | None = None
    result_location: str | None = None
    config: dict[str, Any] | None = None
    host: str | None = None
    git_commit: str | None = None

    @property
    def state(self) -> str:
        """``StepInfo.state``'s value (``completed``, ``failed``, ...); ``invalid``: it raises."""
        if not self.cacheable:
            return "uncacheable"
        times = (self.start_time is not None, self.end_time is not None, self.error is not None)
        states = {
            (False, False, False): "incomplete",
            (True, False, False): "running",
            (True, True, False): "completed",
            (True, True, True): "failed",
        }
        return states.get(times, "invalid")

    @property
    def duration_s(self) -> float | None:
        if self.start_time is None or self.end_time is None:
            return None
        return (self.end_time - self.start_time).total_seconds()


class _StandIn:
    """An object rebuilt from a pickle: its attributes, nothing else."""


def _stand_in(name: str) -> type:
    return type(name, (_StandIn,), {"__module__": __name__})


def _utc() -> dt.tzinfo:
    return dt.timezone.utc


#: The classes of ``tango.step_info`` that a pickled ``StepInfo`` names.
TANGO_CLASSES = (
    "StepInfo",
    "GitMetadata",
    "EnvironmentMetadata",
    "PlatformMetadata",
    "TangoMetadata",
    "StepState",
)
#: What the unpickler builds for the other globals a pickled ``StepInfo`` names.
STANDARD_GLOBALS: dict[tuple[str, str], Callable[..., Any]] = {
    ("datetime", "datetime"): dt.datetime,
    ("datetime", "date"): dt.date,
    ("datetime", "timedelta"): dt.timedelta,
    ("datetime", "timezone"): dt.timezone,
    ("pytz", "_UTC"): _utc,
    ("pathlib", "Path"): pathlib.PurePath,
    ("pathlib", "PosixPath"): pathlib.PurePosixPath,
    ("pathlib", "PurePosixPath"): pathlib.PurePosixPath,
    ("pathlib", "WindowsPath"): pathlib.PureWindowsPath,
    ("pathlib", "PureWindowsPath"): pathlib.PureWindowsPath,
    ("collections", "OrderedDict"): OrderedDict,
    **{("builtins", t.__name__): t for t in (set, frozenset, list, dict, tuple, str, int, float)},
}
#: Every ``(module, name)`` the unpickler resolves.
ALLOWED_GLOBALS = frozenset(
    {("tango.step_info", name) for name in TANGO_CLASSES} | set(STANDARD_GLOBALS)
)
_STAND_INS: dict[str, Callable[..., Any]] = {
    **{name: _stand_in(name) for name in TANGO_CLASSES if name != "StepState"},
    "StepState": str,
}


class RefusedGlobal(pickle.UnpicklingError):
    """A pickle names a global the unpickler does not build; the message is ``module.name``."""


class _StepInfoUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, tango_classes: Mapping[str, Callable[..., Any]]) -> None:
        super().__init__(io.BytesIO(data))
        self.tango_classes = tango_classes

    def find_class(self, module: str, name: str) -> Any:
        if module == "tango.step_info" and name in self.tango_classes:
            return self.tango_classes[name]
        try:
            return STANDARD_GLOBALS[(module, name)]
        except KeyError:
            raise RefusedGlobal(f"{module}.{name}") from None


def load_step_info(
    data: bytes, tango_classes: Mapping[str, Callable[..., Any]] | None = None
) -> Any:
    """A pickled ``StepInfo``, each of :data:`TANGO_CLASSES` built as ``tango_classes`` maps it
    (default: stand-ins that only hold attributes; the state a string), the globals of
    :data:`STANDARD_GLOBALS` as mapped there; :class:`RefusedGlobal` naming any other global
    (``module.name``), or another exception for corrupt data (truncated: ``UnpicklingError``)."""
    return _StepInfoUnpickler(data, _STAND_INS if tango_classes is None else tango_classes).load()


def record(name: str, info: Any) -> StepRecord:
    """A :class:`StepRecord` from a Tango ``StepInfo`` or its stand-in."""
    error = getattr(info, "error", None)
    config = getattr(info, "config", None)
    platform = getattr(info, "platform", None)
    git = getattr(getattr(info, "environment", None), "git", None)
    return StepRecord(
        name=name,
        unique_id=str(info.unique_id),
        step_class_name=getattr(info, "step_class_name", None),
        cacheable=bool(getattr(info, "cacheable", True)),
        version=getattr(info, "version", None),
        start_time=_aware(getattr(info, "start_time", None)),
        end_time=_aware(getattr(info, "end_time", None)),
        error=None if error is None else str(error),
        result_location=getattr(info, "result_location", None),
        config=dict(config) if isinstance(config, dict) else None,
        host=getattr(platform, "host", None),
        git_commit=getattr(git, "commit", None),
    )


def _aware(value: Any) -> dt.datetime | None:
    if not isinstance(value, dt.datetime):
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.timezone.utc)
