"""Tango's search of its integrations for a name no module has registered skips an integration
that fails to import, whatever it raises (``compat.patch_tango_registry_search``)."""

from __future__ import annotations

import importlib.abc
import sys

import pytest
import tango.common.registrable as registrable
from tango.common.exceptions import IntegrationMissingError

import tango_fairscale.compat  # noqa: F401  (applies the patch)

BROKEN = "tango.integrations.broken_by_its_library"


class _Broken(importlib.abc.MetaPathFinder):
    """Finds :data:`BROKEN`, whose import raises as a newer jax made Tango's flax one raise."""

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001
        if name == BROKEN:
            raise AttributeError("module 'jax.random' has no attribute 'PRNGKeyArray'")
        return None


@pytest.fixture
def broken_integration():
    finder = _Broken()
    sys.meta_path.insert(0, finder)
    yield BROKEN
    sys.meta_path.remove(finder)


def test_an_integration_that_raises_at_import_is_skipped_as_missing(broken_integration) -> None:
    for _ in range(2):  # and again without importing it half-way once more
        with pytest.raises(IntegrationMissingError):
            registrable.import_module_and_submodules(broken_integration)


def test_a_module_outside_tangos_integrations_raises_as_it_is() -> None:
    with pytest.raises(ModuleNotFoundError):
        registrable.import_module_and_submodules("tango_fairscale_no_such_module")
