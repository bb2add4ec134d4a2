"""Tango's output without its noise (``compat/tango_output.py``): the package list of a step's
metadata without ``pkg_resources`` (no deprecation warning), one line per finished bar."""

from __future__ import annotations

import warnings

import pytest
from tango.common import Tqdm
from tango.step_info import EnvironmentMetadata

import tango_fairscale.compat  # noqa: F401  (applies the fixes)
from tango_fairscale.compat.tango_output import finished_bar, installed_packages


def test_the_package_list_needs_no_pkg_resources() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the deprecation warning would raise
        packages = EnvironmentMetadata().packages
    assert packages == installed_packages()
    names = dict(packages or [])
    assert "ai2-tango" in names and "torch" in names and names == dict(sorted(names.items()))


def test_the_package_list_is_read_once_a_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tango asks for it before every step: the installed distributions are read once."""
    from importlib import metadata

    first = installed_packages()
    monkeypatch.setattr(metadata, "distributions", lambda: pytest.fail("read again"))
    again = installed_packages()
    assert again == first and again is not first  # a list of its own each time


def test_a_finished_bar_is_drawn_once(capsys: pytest.CaptureFixture[str]) -> None:
    bar = Tqdm.tqdm(total=4, desc="Scoring", unit="query", mininterval=0)
    bar.update(4)
    bar.close()
    err = capsys.readouterr().err
    assert err.count("Scoring: 100%") == 1 and err.count("Scoring:   0%") == 1


def test_only_a_finished_bars_repeat_is_dropped() -> None:
    assert finished_bar("\rScoring: 100%|##########| 128/128 [00:00<00:00, 954.59query/s]") == (
        "Scoring: 100%|##########| 128/128"
    )
    assert finished_bar("\rTraining:  95%|#########5| 19/20 [00:00, loss=7.1]") is None
    assert finished_bar("\n") is None
