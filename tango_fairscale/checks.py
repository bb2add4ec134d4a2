"""Checks of config values, each written once: a one-line ``ConfigurationError`` that names the
field, shows the value and says what to change."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

from tango.common.exceptions import ConfigurationError


def one_line(text: object, limit: int | None = None) -> str:
    """``text`` (an exception's message, say) with its whitespace folded into single spaces."""
    folded = " ".join(str(text).split())
    return folded if limit is None else folded[:limit]


def reason(error: BaseException) -> str:
    """An exception as ``"Type: message"`` on one line, cut to 300 characters."""
    return f"{type(error).__name__}: {one_line(error, 300)}"


def did_you_mean(word: str, choices: Iterable[str], n: int = 1) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``choices``, or ``""`` when none is close."""
    close = difflib.get_close_matches(str(word), list(choices), n=n, cutoff=0.6)
    return f"; did you mean {', '.join(map(repr, close))}?" if close else ""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def integer(name: str, value: Any) -> int:
    """``value`` if it is an integer (``true`` and ``false`` are not)."""
    if not _is_int(value):
        raise ConfigurationError(f"{name} must be an integer, got {value!r}")
    return int(value)


def positive_int(name: str, value: Any, *, optional: bool = False) -> Any:
    """``value`` if it is an integer ≥ 1 (or ``None`` when ``optional``)."""
    if optional and value is None:
        return value
    if not _is_int(value) or value < 1:
        alternative = " or null" if optional else ""
        raise ConfigurationError(f"{name} must be a positive integer{alternative}, got {value!r}")
    return value


def document_limit(name: str, value: Any) -> Any:
    """``value`` if it is ``None``, a whole number of documents ≥ 1, or a fraction of a task's
    documents strictly between 0 and 1 (lm-eval's ``--limit``: its documents × the fraction,
    rounded up)."""
    if value is None or (_is_int(value) and value >= 1):
        return value
    if isinstance(value, float) and 0 < value < 1:
        return value
    raise ConfigurationError(
        f"{name} must be a number of documents (1, 2, ...), a fraction of each task's documents "
        f"between 0 and 1 (0.1), or null; got {value!r}"
    )


def non_negative_int(name: str, value: Any) -> int:
    """``value`` if it is an integer ≥ 0."""
    if not _is_int(value) or value < 0:
        raise ConfigurationError(f"{name} must be 0 or a positive integer, got {value!r}")
    return int(value)


def positive_ints(values: Mapping[str, Any]) -> None:
    """:func:`positive_int` for each ``name: value``."""
    for name, value in values.items():
        positive_int(name, value)


def positive_int_list(name: str, value: Any, what: str = "integers") -> list[int]:
    """``value`` if it is a non-empty list of integers ≥ 1 (``what`` says what they count)."""
    if not isinstance(value, list) or not value or not all(_is_int(v) and v > 0 for v in value):
        raise ConfigurationError(
            f"{name} must be a list of positive {what} (or null), got {value!r}"
        )
    return list(value)


def positive_number(name: str, value: Any, *, optional: bool = False) -> Any:
    """``value`` if it is a number > 0 (or ``None`` when ``optional``)."""
    if optional and value is None:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        alternative = " or null" if optional else ""
        raise ConfigurationError(f"{name} must be a positive number{alternative}, got {value!r}")
    return value


def boolean(name: str, value: Any) -> bool:
    """``value`` if it is ``true`` or ``false``."""
    if not isinstance(value, bool):
        raise ConfigurationError(f"{name} must be true or false, got {value!r}")
    return value


def text(name: str, value: Any, *, optional: bool = False) -> Any:
    """``value`` if it is a string (or ``None`` when ``optional``)."""
    if (optional and value is None) or isinstance(value, str):
        return value
    alternative = " or null" if optional else ""
    raise ConfigurationError(f"{name} must be a text{alternative}, got {value!r}")


def one_of(name: str, value: Any, choices: Iterable[str]) -> str:
    """``value`` if it is one of ``choices``; else the choices and the closest one."""
    choices = list(choices)
    if value not in choices:
        raise ConfigurationError(
            f"unknown {name} {value!r}{did_you_mean(str(value), choices)}; choose one of "
            f"{', '.join(choices)}"
        )
    return str(value)


def split_of(dataset_dict: Any, split: str, *, role: str = "split", optional: bool = False) -> None:
    """``split`` (the value of field ``role``) must be a split of ``dataset_dict`` holding
    examples."""
    if split not in dataset_dict:
        raise ConfigurationError(
            f"{role} {split!r} is not in the dataset; choose one of {sorted(dataset_dict.keys())}"
        )
    if len(dataset_dict[split]) == 0:
        alternative = f", or set {role} to null" if optional else ""
        raise ConfigurationError(
            f"{role} {split!r} holds no examples; give it examples (check 'limit'){alternative}"
        )
