"""A local Tango workspace's files run no code when Tango 1.3.2 reads them.

Tango trusts what it finds in a workspace directory, and a planted file ran a command under the
next ``tango run`` that read it:

* ``stepinfo.sqlite`` holds each step's ``StepInfo`` pickled (``sqlitedict``'s default): any
  pickle there ran when Tango looked the step up. It is read through the allow-list of
  :mod:`tango_fairscale.results.step_infos` (Tango's ``StepInfo`` classes, datetimes, paths,
  builtin containers), and a record naming anything else is refused in one line;
* a workspace without ``settings.json``, or whose ``settings.json`` says version 1, was
  "upgraded" by unpickling each ``cache/*/stepinfo.dill`` with ``dill``: such files are refused;
* ``cache/<id>/cache-metadata.json`` names the ``Format`` that reads the step's result, so the
  file could choose ``DillFormat`` (a pickle) for a step that stores JSON. A step's result is read
  by the format the step declares (``Step.FORMAT``); the metadata file only records it. Tango's
  ``JsonFormat`` itself calls any class a ``_dataclass`` entry names: the package's steps store
  JSON through :class:`~tango_fairscale.tasks.format.JsonDataFormat` instead.
"""

from __future__ import annotations

import functools
import pickle
from typing import Any

#: Where a refused step record or legacy file leaves the user.
_AFTER = "nothing in it ran; remove the file (or use another workspace) and run again"


@functools.cache
def _tango_classes() -> dict[str, Any]:
    """Tango's own classes for the names of ``results.step_infos.TANGO_CLASSES``."""
    import tango.step_info

    from ..results.step_infos import TANGO_CLASSES

    return {name: getattr(tango.step_info, name) for name in TANGO_CLASSES}


def _decode_step_info(data: Any) -> Any:
    """``sqlitedict``'s ``decode`` for ``stepinfo.sqlite``: a ``StepInfo`` through the
    allow-list, or a one-line ``ConfigurationError``."""
    from tango.common.exceptions import ConfigurationError

    from ..results.step_infos import RefusedGlobal, load_step_info

    try:
        return load_step_info(bytes(data), _tango_classes())
    except RefusedGlobal as error:
        raise ConfigurationError(
            f"the workspace's stepinfo.sqlite holds a step record that names {error}, which is "
            f"not part of a Tango step record: {_AFTER}"
        ) from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as error:
        raise ConfigurationError(
            f"the workspace's stepinfo.sqlite holds a step record that is not a Tango step "
            f"record ({type(error).__name__}): {_AFTER}"
        ) from None


class _RefusedLegacyRecords:
    """Stands for ``dill`` in Tango's ``local_workspace`` module, which it only uses to read
    version-1 step records (``cache/*/stepinfo.dill``)."""

    @staticmethod
    def load(file: Any) -> Any:
        from tango.common.exceptions import ConfigurationError

        raise ConfigurationError(
            f"{getattr(file, 'name', 'a stepinfo.dill file')} is a step record of Tango's "
            f"version-1 workspaces, which Tango upgrades by unpickling it: {_AFTER}"
        )


def patch_tango_step_records() -> None:
    """``LocalWorkspace`` decodes ``stepinfo.sqlite`` through the allow-list and refuses
    version-1 step records."""
    from sqlitedict import SqliteDict
    from tango.workspaces import local_workspace

    if getattr(local_workspace.SqliteDict, "decodes_step_infos_safely", False):
        return

    class StepRecords(SqliteDict):  # type: ignore[misc]
        decodes_step_infos_safely = True

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("decode", _decode_step_info)
            super().__init__(*args, **kwargs)

    local_workspace.SqliteDict = StepRecords  # type: ignore[misc]
    local_workspace.dill = _RefusedLegacyRecords  # type: ignore[assignment]


def patch_tango_cached_results() -> None:
    """``LocalStepCache`` reads a step's result with the step's own format."""
    from tango import Step
    from tango.step_caches.local_step_cache import LocalStepCache

    original = LocalStepCache.__getitem__
    if getattr(original, "reads_with_the_steps_format", False):
        return

    def __getitem__(self: LocalStepCache, step: Any) -> Any:
        if not isinstance(step, Step):  # a StepInfo (Tango's results API): no format of its own
            return original(self, step)
        key = step.unique_id
        result = self._get_from_cache(key)
        if result is None:
            if step not in self:
                raise KeyError(step)
            result = step.format.read(self.step_dir(step))
            self._add_to_cache(key, result)
        return result

    __getitem__.reads_with_the_steps_format = True  # type: ignore[attr-defined]
    LocalStepCache.__getitem__ = __getitem__  # type: ignore[method-assign]
