"""Training under torchrun: ``python -m tango_fairscale run`` on every process of a launched job.

Each "node" is a real ``torchrun --nnodes 2 --node-rank N`` process on 127.0.0.1 (gloo on CPU):

* ``engine=fsdp2`` on two nodes of one process ends with the weights of the single-node
  two-process ``tango run`` (within 1e-5), and the workspace holds one completed run with its
  metrics;
* ``engine=fairscale``, one job three times: SIGKILL of rank 1's worker mid-training: both nodes
  exit within seconds, nothing left behind; the same commands again (starting over: no checkpoint
  yet), and SIGTERM to both torchrun agents mid-training (as a cluster's preemption): every rank
  checkpoints and stops; the same commands again resume (not start over) and end with the
  single-node run's weights and one completed run with its metrics;
* ``fsdp2`` with ``hybrid_shard`` on two nodes of two processes (a 2 × 2 mesh) ends with the same
  weights as that single-node run;
* one-line errors: ``device_count`` ≠ the launcher's world size, a workspace that another node
  cannot see (node 1 in its own mount namespace), a rendezvous that nobody else joins, and plain
  ``tango run`` started by a launcher.

Every test here is in the slow tier; the launcher's environment parsing is
``tests/runtime/test_launcher.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import assert_same_weights, child_processes
from safetensors.torch import load_file

from tango_fairscale.runtime.process_group import free_port

REPO_ROOT = Path(__file__).resolve().parents[3]
CONFIG = "configs/gpt2_piqa.jsonnet"
TIMEOUT_S = 300
# SIGTERM arrives after step 1: the ranks stop at the next logged step (10), before the last.
TRAIN = (
    "train_steps=20",
    "limit=32",
    "batch_size=8",
    "validate_every=20",
    "lr=1e-3",
    "precision=32-true",
    "device_count=2",
)
HYBRID = '{"steps.trained_model.engine.sharding.hybrid_shard": true}'


TANGO_RUN = [sys.executable, "-m", "tango", "run"]
#: The launcher's command without a launcher: ``tango run`` (the fsdp2 reference run is this one).
PLAIN_RUN = [sys.executable, "-m", "tango_fairscale", "run"]


def environment() -> dict[str, str]:
    cleared = {name: None for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    base = {k: v for k, v in os.environ.items() if k not in cleared}
    return {**base, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def tango_args(workspace: Path, defines: tuple[str, ...], *extra: str) -> list[str]:
    args = [CONFIG, "-w", str(workspace), *extra]
    for define in defines:
        args += ["-D", define]
    return args


def finish(processes: list[subprocess.Popen], logs: list[Path]) -> list[tuple[int, str]]:
    """Wait for every process (killing all of them on a timeout); their exit codes and output."""
    try:
        codes = [process.wait(timeout=TIMEOUT_S) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    return [(code, log.read_text(errors="replace")) for code, log in zip(codes, logs)]


def start(command: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env or environment(),
            start_new_session=True,
        )


def torchrun_nodes(
    workspace: Path,
    defines: tuple[str, ...],
    *extra: str,
    per_node: int = 1,
    node1_prefix: tuple[str, ...] = (),
    while_running: Callable[[list[subprocess.Popen]], None] | None = None,
) -> list[tuple[int, str]]:
    """Two torchrun "nodes" on this machine running the config; each node's (exit code, output).

    ``while_running(processes)`` is called once both have started.
    """
    port = free_port()
    processes, logs = [], []
    for node in (0, 1):
        torchrun = [
            *(node1_prefix if node == 1 else ()),
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=2",
            f"--nproc-per-node={per_node}",
            f"--node-rank={node}",
            "--master-addr=127.0.0.1",
            f"--master-port={port}",
            "-m",
            "tango_fairscale",
            "run",
            *tango_args(workspace, defines, *extra),
        ]
        logs.append(workspace.parent / f"{workspace.name}-node{node}.log")
        processes.append(start(torchrun, logs[-1]))
    if while_running is not None:
        while_running(processes)
    return finish(processes, logs)


def single_node(runs: dict[Path, tuple[str, ...]], plain: Path) -> None:
    """``tango run`` in each workspace with its defines, all at once (on 2 cores, one run's
    imports overlap another's training); in workspace ``plain``, :data:`PLAIN_RUN` instead."""
    logs = [workspace.parent / f"{workspace.name}.log" for workspace in runs]
    commands = [
        [*TANGO_RUN, *tango_args(workspace, defines)]
        if workspace != plain
        else [*PLAIN_RUN, *tango_args(workspace, defines, "-n", "plain")]
        for workspace, defines in runs.items()
    ]
    for code, output in finish([start(c, log) for c, log in zip(commands, logs)], logs):
        assert code == 0, output[-4000:]


def trained_weights(workspace: Path) -> dict[str, torch.Tensor]:
    [weights] = workspace.glob("cache/TrainStep-*/model.safetensors")
    return load_file(weights)


def assert_same_trained_weights(expected: Path, actual: Path) -> None:
    assert_same_weights(trained_weights(expected), trained_weights(actual))


def assert_succeeded(nodes: list[tuple[int, str]]) -> None:
    for node, (code, output) in enumerate(nodes):
        assert code == 0, f"node {node} failed:\n{output[-6000:]}"


@pytest.fixture(scope="module")
def data(tiny_model_dir: Path, piqa_dir: Path) -> tuple[str, ...]:
    return (f"model={tiny_model_dir}", f"data_dir={piqa_dir}", *TRAIN)


@pytest.fixture(scope="module")
def single_node_runs(tmp_path_factory, data: tuple[str, ...]) -> dict[str, Path]:
    """The single-node two-process run of each sharded engine: ``tango run`` for ``fairscale``,
    ``python -m tango_fairscale run`` without a launcher (run ``plain``) for ``fsdp2``; the logs
    beside the workspaces."""
    root = tmp_path_factory.mktemp("single-node")
    runs = {engine: root / engine for engine in ("fairscale", "fsdp2")}
    single_node(
        {workspace: (*data, f"engine={engine}") for engine, workspace in runs.items()},
        plain=runs["fsdp2"],
    )
    return runs


def assert_one_completed_run_by_rank_0(workspace: Path, nodes: list[tuple[int, str]]) -> None:
    """The workspace holds one completed run (beside any that were stopped) with its metrics, and
    only rank 0 ran Tango."""
    from tango_fairscale.results import collect_runs, open_workspace

    runs = collect_runs(open_workspace(str(workspace)), None)
    [run] = [run for run in runs if run.status == "completed"]
    assert run.metrics is not None and run.metrics["num_examples"] == 32
    assert "Finished step" not in nodes[1][1]  # rank 1 printed no step


@pytest.mark.slow
def test_two_nodes_train_like_one(
    single_node_runs: dict[str, Path], data: tuple[str, ...], tmp_path: Path
) -> None:
    """``fsdp2`` here; ``fairscale`` trains on two nodes in the preemption test below, whose
    resumed job ends with the single-node weights and the same one completed run."""
    workspace = tmp_path / "ws"
    nodes = torchrun_nodes(workspace, (*data, "engine=fsdp2"))
    assert_succeeded(nodes)
    assert_same_trained_weights(single_node_runs["fsdp2"], workspace)
    assert_one_completed_run_by_rank_0(workspace, nodes)
    # Rank 0 gave the finished run's files back: the final checkpoint alone, model-only.
    from tango_fairscale.records.checkpoints import read_manifest

    [final] = workspace.glob("cache/TrainStep-*/work/checkpoints/step*")
    assert read_manifest(final).model_only
    assert not list(workspace.glob("cache/TrainStep-*/work/final_weights.pt"))


@pytest.fixture(scope="module")
def killed_preempted_resumed(tmp_path_factory, data: tuple[str, ...]) -> dict[str, Any]:
    """One ``fairscale`` job on two nodes, the same commands three times in one workspace:
    ``killed`` (SIGKILL of rank 1's worker once training), ``preempted`` (SIGTERM to both agents
    once this job logged a step), ``resumed`` (to the end). Each job's nodes' (exit code,
    output), and what was seen meanwhile."""
    workspace = tmp_path_factory.mktemp("killed-preempted-resumed") / "ws"
    defines = (*data, "engine=fairscale")
    seen: dict[str, Any] = {"workspace": workspace}

    def kill_rank_1_once_training(processes: list[subprocess.Popen]) -> None:
        deadline = time.time() + TIMEOUT_S
        while time.time() < deadline and not logged_steps(workspace):
            time.sleep(0.05)
        [worker] = child_processes(processes[1].pid, b"tango_fairscale")
        os.kill(worker, signal.SIGKILL)
        seen["killed_worker"] = worker

    started = time.time()
    seen["killed"] = torchrun_nodes(workspace, defines, while_running=kill_rank_1_once_training)
    seen["killed_seconds"] = time.time() - started
    seen["killed_worker_left"] = Path(f"/proc/{seen['killed_worker']}").exists()
    before = len(logged_steps(workspace))

    def preempt_once_training(processes: list[subprocess.Popen]) -> None:
        deadline = time.time() + TIMEOUT_S
        while time.time() < deadline and len(logged_steps(workspace)) <= before:
            time.sleep(0.05)
        for process in processes:  # the torchrun agents pass SIGTERM on to their ranks
            process.send_signal(signal.SIGTERM)

    seen["preempted"] = torchrun_nodes(workspace, defines, while_running=preempt_once_training)
    seen["logged_when_preempted"] = logged_steps(workspace)
    seen["resumed"] = torchrun_nodes(workspace, defines)
    return seen


@pytest.mark.slow
def test_preempted_nodes_resume_to_the_same_weights(
    killed_preempted_resumed: dict[str, Any], single_node_runs: dict[str, Path]
) -> None:
    job = killed_preempted_resumed
    workspace, preempted, resumed = job["workspace"], job["preempted"], job["resumed"]
    assert all(code != 0 for code, _ in preempted)
    stopped = [line for line in preempted[0][1].splitlines() if "preempted by SIGTERM" in line]
    assert stopped and "rerun the same command to resume from checkpoint step" in stopped[0]
    assert max(job["logged_when_preempted"]) < 20

    assert_succeeded(resumed)
    after = logged_steps(workspace)[len(job["logged_when_preempted"]) :]
    assert 20 in after and 1 not in after  # resumed, not started over
    assert_same_trained_weights(single_node_runs["fairscale"], workspace)
    assert_one_completed_run_by_rank_0(workspace, resumed)


@pytest.mark.slow
def test_a_killed_rank_stops_every_node_and_the_job_resumes(
    killed_preempted_resumed: dict[str, Any], single_node_runs: dict[str, Path]
) -> None:
    """SIGKILL of rank 1's worker mid-training: both nodes exit (non-zero) within seconds, no
    process is left, and the same commands train again (preempted, then resumed: the test
    above) to the uninterrupted run's weights."""
    job = killed_preempted_resumed
    nodes = job["killed"]
    assert job["killed_seconds"] < 120
    assert all(code != 0 for code, _ in nodes)
    assert "Signal 9 (SIGKILL)" in nodes[1][1] and "rank      : 1" in nodes[1][1]
    assert not job["killed_worker_left"]

    assert_succeeded(job["resumed"])
    assert_same_trained_weights(single_node_runs["fairscale"], job["workspace"])


def logged_steps(workspace: Path) -> list[int]:
    """Steps in the training log of the workspace's train step (rank 0 logs step 1, 10, 20, ...)."""
    return [
        json.loads(line)["step"]
        for log in workspace.glob("cache/TrainStep-*/work/training_log.jsonl")
        for line in log.read_text().splitlines()
        if line.strip()
    ]


@pytest.mark.slow
def test_hybrid_sharding_on_two_nodes_of_two(
    single_node_runs: dict[str, Path], data: tuple[str, ...], tmp_path: Path
) -> None:
    """A 2 × 2 mesh (shard within a node, replicate across) trains like 2 processes in one node."""
    workspace = tmp_path / "ws"
    nodes = torchrun_nodes(
        workspace, (*data, "engine=fsdp2", "device_count=4"), "-o", HYBRID, per_node=2
    )
    assert_succeeded(nodes)
    assert "hybrid sharding: 2 replica(s) x 2 shard(s)" in nodes[0][1]
    assert_same_trained_weights(single_node_runs["fsdp2"], workspace)


@pytest.mark.slow
def test_device_count_must_match_the_launcher(data: tuple[str, ...], tmp_path: Path) -> None:
    nodes = torchrun_nodes(tmp_path / "ws", (*data, "engine=fsdp2", "device_count=4"))
    assert all(code != 0 for code, _ in nodes)  # rank 1 exits with rank 0's exit code
    assert (
        "device_count 4 disagrees with the launcher's 2 processes (WORLD_SIZE); set -D "
        "device_count=2" in nodes[0][1]
    )


def can_unshare_mounts() -> bool:
    probe = ["unshare", "--mount", "sh", "-c", "mount -t tmpfs tmpfs /mnt"]
    try:
        return subprocess.run(probe, capture_output=True).returncode == 0
    except FileNotFoundError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not can_unshare_mounts(), reason="needs unshare --mount (root)")
def test_workspace_must_be_shared_by_every_node(data: tuple[str, ...], tmp_path: Path) -> None:
    """Node 1 runs in its own mount namespace with an empty tmpfs over the workspace."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    hide = f'mount -t tmpfs tmpfs {workspace} && exec "$@"'
    nodes = torchrun_nodes(
        workspace,
        (*data, "engine=fairscale"),
        node1_prefix=("unshare", "--mount", "sh", "-c", hide, "sh"),
    )
    assert all(code != 0 for code, _ in nodes)
    line = next(line for line in nodes[0][1].splitlines() if "rank 1: cannot see" in line)
    assert f" ERROR    rank 1: cannot see {workspace}/cache/TrainStep-" in line, line
    assert "the workspace (-w) must be on storage every node mounts at the same path" in line


@pytest.mark.slow
def test_rendezvous_nobody_joins_is_one_line(tmp_path: Path) -> None:
    port = free_port()
    env = {
        **environment(),
        "RANK": "0",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    command = [sys.executable, "-m", "tango_fairscale", "run", "--rendezvous-timeout", "2"]
    result = subprocess.run(
        [*command, *tango_args(tmp_path / "ws", ())],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.startswith(
        f"tango-fairscale: error: rank 0 could not meet the other 1 process(es) at "
        f"127.0.0.1:{port} within 2 s ("
    ), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.slow
def test_without_a_launcher_run_is_tango_run(single_node_runs: dict[str, Path]) -> None:
    """The fsdp2 reference run (:func:`single_node_runs`), whose weights the torchrun jobs
    match: ``python -m tango_fairscale run -n plain`` without a launcher."""
    workspace = single_node_runs["fsdp2"]
    output = (workspace.parent / f"{workspace.name}.log").read_text()
    assert "Finished run plain" in output
    assert (workspace / "runs" / "plain" / "metrics").exists()


@pytest.mark.slow
def test_plain_tango_run_under_a_launcher_is_refused(data: tuple[str, ...], tmp_path: Path) -> None:
    env = {
        **environment(),
        "RANK": "0",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    command = [*TANGO_RUN, *tango_args(tmp_path / "ws", data)]
    result = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert result.returncode != 0
    assert (
        "this process is one of 2 started by a launcher (WORLD_SIZE is set): start them with "
        "'python -m tango_fairscale run ...' instead of 'tango run ...'"
    ) in result.stdout + result.stderr
