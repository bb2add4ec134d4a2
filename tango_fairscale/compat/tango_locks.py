"""Two ``tango run``s on one local workspace at once: a step one of them runs is waited for by the
other, never run twice (Tango 1.3.2's ``LocalWorkspace``).

Tango marks a step running in ``stepinfo.sqlite`` and holds ``cache/<id>/lock`` (``flock``) while
it runs. Its ``step_starting`` reads the state *before* taking the lock, so:

* a second run reaching a step the first is running fails at once (``StepStateError: ... in
  unexpected state 'running' ... delete the lock file``, with a traceback);
* two runs that reach a step together both read "incomplete": the second waits for the lock, then
  runs the step again once the first has completed it, and fails at the end ("... already
  exists! Will not overwrite"), leaving the step recorded as failed although its result is
  stored -- a failure ``tango-fairscale results`` then shows for the first run too;
* a run reading a step's state while another holds the lock but has not yet recorded it (or has
  recorded the end and not yet released the lock) fails with ``IOError: The step ... is marked
  as being incomplete, but we determined it can only be one of {running}``.

Here the lock is taken first and the state read under it: a step another run holds is waited for
(one progress line: "waiting for step 'NAME', which another run holds"), then its stored result is
used; a step whose holder failed or died is run again. A locked step may be in any recorded state
(its holder is between taking the lock and recording the state). Tango's state check tries for
0.1 s to take the lock of a step whose state it reads, also while this very process holds it (at
every step's end): the lock files this process holds are answered at once.
"""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any

#: The step locks this process holds, by lock file path.
_held: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()


def patch_tango_step_locks() -> None:
    from tango.workspaces import LocalWorkspace

    if getattr(LocalWorkspace.step_starting, "locks_first", False):
        return
    original_guess = LocalWorkspace.guess_step_dir_state.__func__  # type: ignore[attr-defined]

    def guess_step_dir_state(cls: Any, directory: Any) -> Any:
        from tango.step_info import StepState

        held = _held.get(str(Path(directory) / "lock"))
        if held is not None and held.is_locked:  # this process runs the step
            return set(StepState)
        states = original_guess(cls, directory)
        return set(StepState) if states == {StepState.RUNNING} else states

    step_starting.locks_first = True  # type: ignore[attr-defined]
    LocalWorkspace.step_starting = step_starting  # type: ignore[method-assign]
    LocalWorkspace.guess_step_dir_state = classmethod(guess_step_dir_state)  # type: ignore[assignment]


def step_starting(self: Any, step: Any) -> None:
    """``LocalWorkspace.step_starting`` with the step's lock taken before its state is read (see
    the module docstring): raises ``StepStateError`` (completed) when another run completed the
    step meanwhile, which ``Step.result`` answers from the cache."""
    from tango.common.file_lock import FileLock

    if not step.cache_results:
        return
    self.step_info(step)  # records a new step (and its dependencies) before the lock is taken
    lock_file = self._step_lock_file(step)
    lock = FileLock(lock_file, read_only_ok=True)
    lock.acquire_with_updates(desc=f"waiting for step '{step.name}', which another run holds")
    try:
        _record_start(self, step)
    except BaseException:
        lock.release()
        raise
    self.locks[step] = lock
    _held[str(lock_file)] = lock


def _record_start(workspace: Any, step: Any) -> None:
    """Mark ``step`` running, its lock held here: whatever state is recorded is final (read
    through the records' allow-list, :func:`.tango_workspace.patch_tango_step_records`)."""
    from tango.common.exceptions import StepStateError
    from tango.common.util import utc_now_datetime
    from tango.step_info import StepState
    from tango.workspaces import local_workspace

    with local_workspace.SqliteDict(workspace.step_info_file) as database:
        info = database[step.unique_id]
        workspace._fix_step_info(info)
        if info.state == StepState.COMPLETED:
            raise StepStateError(step, info.state, "(another run completed it)")
        if info.state == StepState.FAILED:
            info.refresh()  # this process's environment, as Tango does
        # "running" under this lock: its process died without recording the end.
        info.start_time = utc_now_datetime()
        info.end_time = None
        info.error = None
        info.result_location = None
        database[step.unique_id] = info
        database.commit()
