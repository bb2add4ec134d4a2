"""Probe FairScale FSDP on CPU with chosen compat fixes applied (run by test_fairscale_fixes.py).

    python tests/integration/compat/fairscale_probe.py WORLD_SIZE CASE [FIX ...]

Exits 0 when the case runs, 1 with the error's type and message on stderr when it fails.

    python tests/integration/compat/fairscale_probe.py --many \
        '[[WORLD_SIZE, CASE, [FIX, ...]], ...]'

runs each probe in a process forked from this one (torch and FairScale imported once, nothing
patched: the fixes are applied in the probe's own ranks) and prints, as JSON, each probe's exit
code, stdout and stderr as the single probe's command would have given them.
"""

import importlib.util
import json
import os
import socket
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def load_compat():
    """tango_fairscale/compat/fairscale.py alone (it imports nothing of the package)."""
    path = Path(__file__).resolve().parents[3] / "tango_fairscale" / "compat" / "fairscale.py"
    spec = importlib.util.spec_from_file_location("compat", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PATCHES = {"use_null_streams", "skip_pinned_memory", "use_list_collectives_for_gloo"}


def build(case: str, fixes: list[str]) -> torch.nn.Module:
    from fairscale.nn.data_parallel import FullyShardedDataParallel as FSDP

    torch.manual_seed(0)
    inner = torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.Linear(8, 2))
    options = {"compute_device": torch.device("cpu")}
    if case == "offload":
        options.update(move_params_to_cpu=True, move_grads_to_cpu=True)
    if case == "mixed":
        options.update(
            mixed_precision=True,
            compute_dtype=torch.bfloat16,
            fp32_reduce_scatter="fp32_reduce_scatter" in fixes,
        )
    inner[0] = FSDP(inner[0], **options)
    return FSDP(inner, **options)


def run_case(case: str, fixes: list[str]) -> None:
    compat = load_compat()
    model = build(case, fixes)
    if case == "load_shards":
        state = model.local_state_dict()
        fresh = build(case, fixes)  # a nested model that never ran a forward
        if "load_local_state_dict" in fixes:
            compat.load_local_state_dict(fresh, state)
        else:
            fresh.load_local_state_dict(state)
        return
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    loss = model(torch.arange(4).view(2, 2)).float().square().mean()
    loss.backward()
    dtypes = sorted({str(p.grad.dtype) for p in model.parameters() if p.grad is not None})
    print("gradient dtypes:", *dtypes)
    if case == "clip":
        if "clip_grad_norm_" in fixes:
            compat.clip_grad_norm_(model, 1e-3)
        else:
            model.clip_grad_norm_(1e-3)
    optimizer.step()


def worker(rank: int, world_size: int, port: int, case: str, fixes: list[str]) -> None:
    compat = load_compat()
    for fix in fixes:
        if fix in PATCHES:
            getattr(compat, fix)()
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    try:
        run_case(case, fixes)
    except Exception as error:
        # Every rank prints: the first rank to fail makes the launcher terminate the others,
        # rank 0 perhaps before it had printed.
        traceback.print_exc()
        print(f"{type(error).__name__}: {error}", file=sys.stderr, flush=True)
        os._exit(1)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def probe(world_size: int, case: str, fixes: list[str], start_method: str = "spawn") -> int:
    """The probe's exit code: 0 when every rank ran the case."""
    try:
        mp.start_processes(
            worker,
            args=(world_size, free_port(), case, fixes),
            nprocs=world_size,
            start_method=start_method,
        )
    except Exception:
        return 1
    return 0


def probe_forked(world_size: int, case: str, fixes: list[str], out: Path) -> dict:
    """One probe in a forked child whose stdout and stderr go to files in ``out``."""
    stdout, stderr = out / "stdout", out / "stderr"
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: its output to the files, its ranks forked from it
        code = 1
        try:
            with stdout.open("w") as o, stderr.open("w") as e:
                os.dup2(o.fileno(), 1)
                os.dup2(e.fileno(), 2)
                code = probe(world_size, case, fixes, start_method="fork")
                sys.stdout.flush()
                sys.stderr.flush()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return {
        "returncode": os.waitstatus_to_exitcode(status),
        "stdout": stdout.read_text(),
        "stderr": stderr.read_text(),
    }


def many(probes: list[tuple[int, str, list[str]]]) -> list[dict]:
    import tempfile

    # Imported once, before the forks: FairScale, and torch._dynamo, which the optimizer's
    # first step imports (~1.5 s a process otherwise).
    import fairscale.nn.data_parallel  # noqa: F401
    import torch._dynamo  # noqa: F401

    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for index, (world_size, case, fixes) in enumerate(probes):
            out = Path(scratch) / str(index)
            out.mkdir()
            results.append(probe_forked(world_size, case, fixes, out))
    return results


if __name__ == "__main__":
    if sys.argv[1] == "--many":
        print(json.dumps(many(json.loads(sys.argv[2]))))
    else:
        sys.exit(probe(int(sys.argv[1]), sys.argv[2], sys.argv[3:]))
