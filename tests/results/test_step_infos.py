"""Step infos are read without running code: every global a hostile pickle can name is refused."""

from __future__ import annotations

import pickle

import pytest
from helpers.hostile_pickles import calling_pickle, hostile_globals

from tango_fairscale.results import step_infos


def test_every_hostile_global_is_refused(tmp_path) -> None:
    checked = 0
    for index, (module, name) in enumerate(hostile_globals(step_infos.ALLOWED_GLOBALS)):
        marker = tmp_path / f"ran-{index}"
        for protocol in (2, 4):
            with pytest.raises(pickle.UnpicklingError, match=f"^{module}.{name}$"):
                step_infos.load_step_info(calling_pickle(module, name, marker, protocol))
            checked += 1
        assert not marker.exists()
    assert checked > 500
