"""Fixes for what the pinned stack gets wrong today, each applied once at import and guarded.

* Tango 1.3.2 records the git commit and ``origin`` remote of the working directory before each
  step and crashes (``ValueError``) in a repository with no commit or no ``origin`` remote — a
  fresh ``git init`` or a clone whose remote was renamed. Record no git metadata there instead.
  (``EnvironmentMetadata`` captured the method as its dataclass default factory, so the factory
  held by its ``__init__`` is replaced, not just the class attribute.)
"""

from __future__ import annotations

from typing import Any


def patch_tango_git_metadata() -> None:
    from tango.step_info import EnvironmentMetadata, GitMetadata

    original = GitMetadata.check_for_repo

    def check_for_repo() -> GitMetadata | None:
        try:
            return original()
        except ValueError:  # no commit yet, or no "origin" remote
            return None

    cells: Any = EnvironmentMetadata.__init__.__closure__ or ()
    for cell in cells:
        if cell.cell_contents == original:
            cell.cell_contents = check_for_repo


def apply() -> None:
    patch_tango_git_metadata()
