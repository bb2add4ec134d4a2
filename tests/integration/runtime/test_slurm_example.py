"""``examples/slurm_gpt2_piqa.sbatch`` runs as written, under a stand-in for SLURM.

``srun`` here starts the script's per-node command once per node with ``SLURM_NODEID`` set (as
SLURM does, both on this machine) and ``scontrol`` names 127.0.0.1 twice, so the script's own
``torchrun`` lines train the config on two "nodes" of one CPU process each (``GPUS_PER_NODE=1``)
with FSDP2 hybrid sharding and the SIGUSR1 preemption signal, and the workspace ends with one
completed run and its metrics.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tango_fairscale.runtime.process_group import free_port

REPO_ROOT = Path(__file__).resolve().parents[3]
FAKE_SRUN = """#!/bin/bash
while [[ "$1" == --* ]]; do shift; done   # srun's own options
pids=()
for ((node = 0; node < SLURM_JOB_NUM_NODES; node++)); do
  SLURM_NODEID=$node "$@" &
  pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
exit $rc
"""
FAKE_SCONTROL = """#!/bin/bash
printf '127.0.0.1\\n127.0.0.1\\n'
"""


@pytest.mark.slow
def test_slurm_example_trains_on_two_nodes(tmp_path: Path, tiny_model_dir: Path, piqa_dir: Path):
    from tango_fairscale.results import collect_runs, open_workspace

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    workspace = tmp_path / "ws"
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR")},
        "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_NODELIST": "node[0-1]",
        "GPUS_PER_NODE": "1",
        "MASTER_PORT": str(free_port()),
        "WORKSPACE": str(workspace),
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    defines = [
        f"model={tiny_model_dir}",
        f"data_dir={piqa_dir}",
        "train_steps=4",
        "limit=32",
        "batch_size=8",
        "validate_every=2",
        "lr=1e-3",
        "precision=32-true",
    ]
    arguments = [argument for define in defines for argument in ("-D", define)]
    done = subprocess.run(
        ["bash", "examples/slurm_gpt2_piqa.sbatch", *arguments],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert "hybrid sharding: 2 replica(s) x 1 shard(s)" in output
    [run] = collect_runs(open_workspace(str(workspace)), None)
    assert run.metrics is not None and run.metrics["num_examples"] == 32
