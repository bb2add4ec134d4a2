"""Tango's step infos without Tango: :class:`StepRecord` and the unpickler of ``stepinfo.sqlite``.

The unpickler maps Tango's ``StepInfo`` and its metadata classes to stand-ins that only hold
attributes, datetimes and paths to their (pure) standard-library types, and refuses every other
global, so nothing a pickle names is imported or executed.
"""

from __future__ import annotations

import datetime as dt
import io
import pathlib
import pickle
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["RefusedGlobal", "StepRecord", "load_step_info", "record"]


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


_TANGO_CLASSES = (
    "StepInfo",
    "GitMetadata",
    "EnvironmentMetadata",
    "PlatformMetadata",
    "TangoMetadata",
)
_ALLOWED: dict[tuple[str, str], Callable[..., Any]] = {
    **{("tango.step_info", name): _stand_in(name) for name in _TANGO_CLASSES},
    ("tango.step_info", "StepState"): str,
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


class RefusedGlobal(pickle.UnpicklingError):
    """A pickle names a global the unpickler does not build; the message is ``module.name``."""


class _StepInfoUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise RefusedGlobal(f"{module}.{name}") from None


def load_step_info(data: bytes) -> Any:
    """The stand-in of a pickled ``StepInfo``; :class:`RefusedGlobal` naming a refused global
    (``module.name``), or another exception for corrupt data (truncated: ``UnpicklingError``)."""
    return _StepInfoUnpickler(io.BytesIO(data)).load()


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
