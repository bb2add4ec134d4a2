"""Each compatibility fix is needed (the case fails without it) and sufficient (it runs with it).

The FairScale cases run ``fairscale_probe.py`` (beside this file): each probe in a process of its
own (forked from one that imported torch and FairScale once, before any fix), since the fixes
patch modules process-wide.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

PROBE = Path(__file__).with_name("fairscale_probe.py")
STREAMS = "use_null_streams"
GLOO = "use_list_collectives_for_gloo"

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the fixes are for CPU processes")

#: (world size, case, the fix it needs, the fixes it needs besides, the error without it).
CASES = [
    (1, "basic", STREAMS, [], "KeyError: 'all_gather'"),
    (1, "offload", "skip_pinned_memory", [STREAMS], "accelerator"),
    (2, "basic", GLOO, [STREAMS], "Check failed"),
    (1, "mixed", "fp32_reduce_scatter", [STREAMS], "expected dtype float"),
    (1, "clip", "clip_grad_norm_", [STREAMS], "CUDA"),
    (2, "load_shards", "load_local_state_dict", [STREAMS, GLOO], "_full_param_padded"),
]
Probe = tuple[int, str, tuple[str, ...]]


@pytest.fixture(scope="module")
def probes() -> dict[Probe, dict]:
    """Every case without and with its fix, run once by one ``fairscale_probe.py --many``: each
    probe's exit code, stdout and stderr."""
    wanted: list[Probe] = []
    for world_size, case, needed, also, _ in CASES:
        wanted += [(world_size, case, tuple(also)), (world_size, case, (*also, needed))]
    done = subprocess.run(
        [sys.executable, str(PROBE), "--many", json.dumps(wanted)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(zip(wanted, json.loads(done.stdout.splitlines()[-1]), strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("world_size, case, needed, also, error", CASES)
def test_fix_is_needed_and_sufficient(probes, world_size, case, needed, also, error) -> None:
    without = probes[world_size, case, tuple(also)]
    with_fix = probes[world_size, case, (*also, needed)]
    assert without["returncode"] != 0 and error in without["stderr"], without["stderr"][-2000:]
    assert with_fix["returncode"] == 0, with_fix["stderr"][-2000:]


@pytest.mark.slow
def test_mixed_precision_gradients_are_fp32_at_world_size_1(probes) -> None:
    result = probes[1, "mixed", (STREAMS, "fp32_reduce_scatter")]
    assert "gradient dtypes: torch.float32\n" in result["stdout"]
