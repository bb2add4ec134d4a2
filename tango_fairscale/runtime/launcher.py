"""Training under an external launcher (``torchrun``, SLURM): one process per device on every node.

Every process of the job runs the same command::

    torchrun --nnodes 2 --nproc-per-node 8 --node-rank $NODE_RANK \\
        --master-addr $HOST --master-port 29500 \\
        -m tango_fairscale run configs/gpt2_piqa.jsonnet -w /shared/workspace -D device_count=16

Rank 0 runs ``tango run`` with the remaining arguments and is the only process that touches the
Tango workspace. The other ranks wait. When rank 0 reaches a ``tango_fairscale::train`` step it
publishes the step's plan through the launcher's key-value store (the one ``torchrun`` hosts, or
rank 0 hosts at ``MASTER_ADDR:MASTER_PORT``); every rank checks that it can take part (it sees
the step's directory, so the workspace is on shared storage; it has its GPU) and then all train
together in one process group built on that store. Afterwards the other ranks wait for the next
train step, until rank 0's ``tango run`` ends and they exit with its exit code.

The store is the job's own trusted channel (as for ``torch.distributed``'s object collectives):
plans travel through it pickled.
"""

from __future__ import annotations

import logging
import os
import pickle
import secrets
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tango.common.exceptions import ConfigurationError

logger = logging.getLogger(__name__)

#: The variables a launcher sets for every process (``torchrun`` sets them all).
LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_PREFIX = "tango_fairscale"


class LaunchError(RuntimeError):
    """The job cannot start or go on: its command line is refused, its processes could not meet,
    or one of them was lost. The message is one line."""


@dataclass(frozen=True)
class LaunchEnvironment:
    """This process's place in the job, read from the launcher's environment variables."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int  # processes on this node
    master_addr: str
    master_port: int
    attempt: int  # torchrun's restart count: a restarted job must not read the old one's keys

    @classmethod
    def from_environ(cls, environ: dict[str, str] | None = None) -> LaunchEnvironment | None:
        """The environment of a launched process; ``None`` when no launcher started this one."""
        environ = dict(os.environ if environ is None else environ)
        present = [name for name in LAUNCH_VARIABLES if environ.get(name)]
        if not present:
            return None
        missing = [name for name in LAUNCH_VARIABLES if name not in present]
        if missing:
            raise ConfigurationError(
                f"{', '.join(present)} set but {', '.join(missing)} not: start the job with "
                f"torchrun, or set all of {', '.join(LAUNCH_VARIABLES)}"
            )
        try:
            rank, world_size, port = (
                int(environ[name]) for name in ("RANK", "WORLD_SIZE", "MASTER_PORT")
            )
            local_rank = int(environ.get("LOCAL_RANK", "0"))
            local_world_size = int(environ.get("LOCAL_WORLD_SIZE", "1"))
            attempt = int(environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        except ValueError:
            values = {name: environ.get(name) for name in (*LAUNCH_VARIABLES, "LOCAL_RANK")}
            raise ConfigurationError(f"launcher variables must be integers, got {values}") from None
        if not 0 <= rank < world_size or not 0 <= local_rank < local_world_size <= world_size:
            raise ConfigurationError(
                f"inconsistent launcher variables: RANK={rank} WORLD_SIZE={world_size} "
                f"LOCAL_RANK={local_rank} LOCAL_WORLD_SIZE={local_world_size}"
            )
        return cls(
            rank,
            world_size,
            local_rank,
            local_world_size,
            environ["MASTER_ADDR"],
            port,
            attempt,
        )

    def local_device(self) -> int:
        """This process's GPU index on its node, or ``-1`` (CPU) when the node has no GPU."""
        if not torch.cuda.is_available():
            return -1
        visible = torch.cuda.device_count()
        if self.local_world_size > visible:
            raise ConfigurationError(
                f"the launcher starts {self.local_world_size} processes on this node but it has "
                f"{visible} visible GPUs; start at most {visible} per node (--nproc-per-node)"
            )
        return self.local_rank


class Launch:
    """This process's connection to the other processes of a launched job (see the module doc).

    Rank 0 calls :meth:`publish` for each train step; the other ranks run :meth:`follow`.
    """

    def __init__(self, environment: LaunchEnvironment, timeout: timedelta) -> None:
        self.environment = environment
        self.timeout = timeout
        address = f"{environment.master_addr}:{environment.master_port}"
        try:
            store = next(dist.rendezvous("env://", timeout=timeout))[0]
        except (dist.DistError, RuntimeError) as error:
            reason = str(error).strip().splitlines()[0] if str(error).strip() else "no answer"
            raise LaunchError(
                f"rank {environment.rank} could not meet the other "
                f"{environment.world_size - 1} process(es) at {address} within "
                f"{timeout.total_seconds():.0f} s ({reason}); check MASTER_ADDR/MASTER_PORT, "
                "that every node was started, and --rendezvous-timeout"
            ) from None
        self.store = dist.PrefixStore(f"{_PREFIX}/attempt{environment.attempt}", store)
        self._jobs = 0

    @property
    def rank(self) -> int:
        return self.environment.rank

    def job_store(self, job: int) -> dist.Store:
        """The store in which job ``job``'s process group meets."""
        return dist.PrefixStore(f"group{job}", self.store)

    # --- rank 0 -------------------------------------------------------------------------------

    def publish(self, work_dir: Path, plan: Any) -> int:
        """Hand ``plan`` to every rank; return the job's number once all of them are ready.

        Raises ``ConfigurationError`` naming each rank that cannot take part (the job is then
        called off on every rank).
        """
        job = self._next_job()
        marker = _marker(work_dir, job)
        token = secrets.token_hex(8)
        marker.write_text(token)
        self._put(f"job{job}", ("train", (work_dir, token, plan)))
        problems = []
        for rank in range(1, self.environment.world_size):
            try:
                self.store.wait([f"ready{job}/{rank}"], self.timeout)
            except dist.DistStoreError:
                problems.append(
                    f"rank {rank} did not answer within {self.timeout.total_seconds():.0f} s"
                )
                continue
            problem = self.store.get(f"ready{job}/{rank}").decode()
            if problem:
                problems.append(f"rank {rank}: {problem}")
        self.store.set(f"go{job}", "no" if problems else "yes")
        marker.unlink()
        if problems:
            raise ConfigurationError("; ".join(problems))
        return job

    def finish(self, exit_code: int) -> None:
        """Tell the other ranks that rank 0 is done, with its exit code."""
        self._put(f"job{self._next_job()}", ("done", exit_code))

    def _put(self, key: str, message: tuple[str, Any]) -> None:
        self.store.set(key, pickle.dumps(message))  # type: ignore[arg-type]  # takes bytes too

    def _next_job(self) -> int:
        self._jobs += 1
        return self._jobs

    # --- the other ranks ----------------------------------------------------------------------

    def follow(self, train: Callable[[int, Any], None]) -> int:
        """Take part in every job rank 0 publishes; return rank 0's exit code when it ends.

        ``train(job, plan)`` runs this rank's part of a job. A job that fails here is logged
        and left to rank 0, which fails the same way or times out in a collective.
        """
        while True:
            job = self._next_job()
            kind, content = pickle.loads(self._wait_for(f"job{job}"))
            if kind == "done":
                return int(content)
            work_dir, token, plan = content
            problem = self._readiness(_marker(work_dir, job), token)
            self.store.set(f"ready{job}/{self.rank}", problem)
            if self._wait_for(f"go{job}") != b"yes" or problem:
                continue
            try:
                train(job, plan)
            except Exception as error:  # rank 0 reports the job's failure
                logger.error("rank %d: training failed: %s", self.rank, error)

    def _readiness(self, marker: Path, token: str) -> str:
        """Why this rank cannot take part in a job ('' when it can)."""
        try:
            seen = marker.read_text()
        except OSError:
            seen = None
        if seen != token:
            return (
                f"cannot see {marker.parent} written by rank 0: in a multi-node run the "
                "workspace (-w) must be on storage every node mounts at the same path"
            )
        try:
            self.environment.local_device()
        except ConfigurationError as error:
            return str(error)
        return ""

    def _wait_for(self, key: str) -> bytes:
        """The value of ``key`` once rank 0 sets it, however long rank 0's other steps take."""
        while True:
            try:
                self.store.wait([key], timedelta(seconds=60))
                return bytes(self.store.get(key))
            except dist.DistStoreError:
                continue  # not yet: rank 0 is still busy
            except dist.DistNetworkError:
                raise LaunchError(
                    f"rank {self.rank} lost the connection to rank 0's store; rank 0 stopped"
                ) from None


def _marker(work_dir: Path, job: int) -> Path:
    return Path(work_dir).resolve() / f".launch-job{job}"


_current: Launch | None = None


def current() -> Launch | None:
    """The launched job this process belongs to, while :func:`run` runs (else ``None``)."""
    return _current


def run(
    tango_args: Sequence[str],
    train: Callable[[Launch, int, Any], None],
    rendezvous_timeout: timedelta,
) -> int:
    """``tango run TANGO_ARGS`` on rank 0 of a launched job, the follower loop on the others.

    Without launcher variables this is plain ``tango run`` in this process. Returns the exit
    code (rank 0's on every rank).
    """
    global _current
    environment = LaunchEnvironment.from_environ()
    if environment is None:
        return _tango_run(tango_args)
    launch = Launch(environment, rendezvous_timeout)
    _current = launch
    try:
        if launch.rank != 0:
            _log_to_stderr(launch.rank)
            return launch.follow(lambda job, plan: train(launch, job, plan))
        exit_code = 1
        try:
            exit_code = _tango_run(tango_args)
        finally:
            launch.finish(exit_code)
        return exit_code
    finally:
        _current = None


def _tango_run(tango_args: Sequence[str]) -> int:
    from tango.__main__ import main as tango_main

    from ..command_line import check_tango_run

    # What `tango run` checks at the package's import: this process imported it before.
    try:
        check_tango_run(["run", *tango_args])
    except ConfigurationError as error:
        raise LaunchError(str(error)) from None
    try:
        tango_main(args=["run", *tango_args], prog_name="tango")
    except SystemExit as done:
        code = done.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0


def _log_to_stderr(rank: int) -> None:
    logging.basicConfig(
        level=logging.INFO,
        format=f"[rank {rank}] %(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
