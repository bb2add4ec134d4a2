"""A run's own view of its steps: each step's state for this run, the run's status, its wall time.

Tango keeps one step info per unique id, shared by every run that has the step: after run B's
attempt at a step failed and a later run A completed the same step, B's step infos say
"completed". A run's window -- from its registration to the last write of its log -- tells the
cases apart: a step that started after the window was executed again by a later run, and this
run's attempt is known from its log alone.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass

from .step_infos import StepRecord
from .workspace import RunRecord, WorkspaceReader

__all__ = ["StepStatus", "run_start", "run_status", "step_statuses", "wall_time"]

# A step's start is recorded just after the run logs "Starting step": allow for that gap.
_SLACK = dt.timedelta(seconds=1)


@dataclass(frozen=True)
class StepStatus:
    """A step as this run saw it.

    ``state``: ``completed``, ``failed``, ``running``, ``interrupted`` (marked running, nobody
    holds its lock), ``incomplete`` (not run by this run, or run again by a later one after this
    run's attempt did not finish), ``uncacheable``, ``invalid``. ``reused``: completed before this
    run began; ``own``: the record (times, files) is this run's execution of the step;
    ``superseded``: a later run executed the step again. ``error``: this run's exception message.
    """

    state: str
    record: StepRecord
    reused: bool = False
    own: bool = False
    superseded: bool = False
    error: str | None = None


def step_statuses(reader: WorkspaceReader, run: RunRecord) -> dict[str, StepStatus]:
    """Each step's state for this run, from its record and the run's time window.

    A step that started after the run's log was last written was executed again by a later run:
    for this one it failed if its log says so, else it did not finish. A failure recorded before
    the run began, and not retried by it, is not this run's.
    """
    start = run_start(run)
    failures: dict[str, str | None] | None = None
    statuses = {}
    for name, step in run.steps.items():
        began, state = step.start_time, step.state
        if began is None or state in ("uncacheable", "invalid"):
            statuses[name] = StepStatus(state, step)
        elif run.log_end is not None and began > run.log_end + _SLACK and state != "running":
            failures = reader.logged_failures(run) if failures is None else failures
            state = "failed" if name in failures else "incomplete"
            statuses[name] = StepStatus(state, step, superseded=True, error=failures.get(name))
        elif began < start and state in ("completed", "failed"):
            reused = state == "completed"  # else: an old failure this run did not retry
            statuses[name] = StepStatus("completed" if reused else "incomplete", step, reused)
        elif state == "running" and reader.lock_held(step) is False:
            statuses[name] = StepStatus("interrupted", step, own=True)
        else:
            error = _last_line(step.error) if state == "failed" else None
            statuses[name] = StepStatus(state, step, own=True, error=error)
    return statuses


def run_status(
    statuses: Mapping[str, StepStatus], metrics_step: str | None, metrics_read: bool
) -> tuple[str, str | None]:
    """``(status, error)``: ``failed: <steps>`` (any step failed in this run) before ``running``,
    ``interrupted: <steps>``, ``no metrics step``, ``incomplete``, ``metrics result missing`` and
    ``completed``; ``error`` is ``"<step>: <message>"`` of the first failed step."""
    failed = sorted(name for name, s in statuses.items() if s.state == "failed")
    if failed:
        return "failed: " + ", ".join(
            failed
        ), f"{failed[0]}: {statuses[failed[0]].error or 'failed'}"
    if any(s.state == "running" for s in statuses.values()):
        return "running", None
    interrupted = sorted(name for name, s in statuses.items() if s.state == "interrupted")
    if interrupted:
        return "interrupted: " + ", ".join(interrupted), None
    if metrics_step is None:
        return "no metrics step", None
    if statuses[metrics_step].state != "completed":
        return "incomplete", None
    return ("completed" if metrics_read else "metrics result missing"), None


def wall_time(run: RunRecord, statuses: Mapping[str, StepStatus]) -> float | None:
    """Seconds from the start of the run's ``tango run`` process (before Tango built its steps
    and their models) to the last write of its log (running: until now), when both are known.
    Else from the first start to the last end of the steps this run executed itself (a running
    step: until now); 0 when it reused every result, ``None`` when it ran nothing."""
    if run.started is not None and run.log_end is not None:
        running = any(s.state == "running" for s in statuses.values())
        end = dt.datetime.now(dt.timezone.utc) if running else run.log_end
        return max(0.0, (end - run.started).total_seconds())
    own = [s.record for s in statuses.values() if s.own]
    starts = [r.start_time for r in own if r.start_time is not None]
    ends = [r.end_time or dt.datetime.now(dt.timezone.utc) for r in own]
    if any(s.superseded for s in statuses.values()) and run.log_end is not None:
        # The attempt a later run redid is known from this run's registration and log alone.
        starts, ends = starts or [run_start(run)], [*ends, run.log_end]
    if not starts:
        return 0.0 if any(s.reused for s in statuses.values()) else None
    return max(0.0, (max(ends, default=max(starts)) - min(starts)).total_seconds())


def run_start(run: RunRecord) -> dt.datetime:
    """The run's registration as an aware time (Tango records local time without a zone)."""
    return run.start_date.astimezone() if run.start_date.tzinfo is None else run.start_date


def _last_line(error: str | None) -> str | None:
    lines = [line.strip() for line in str(error or "").splitlines() if line.strip()]
    return lines[-1] if lines else None
