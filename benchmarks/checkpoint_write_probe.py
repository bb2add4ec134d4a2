"""What writing one checkpoint file costs on this host, by part: the file write, the SHA-256
digest the manifest records, and the two together as ``records.manifest.write_file`` does them
(each large write hashed on a thread while the file takes it, the file synced to the disk at its
end) against one after the other; and
reading a file back to verify it (``records.manifest.file_record``: each chunk hashed while the
next is read) against reading and hashing in turn, from the page cache (a resume right after a
stop) and, where the container lets root drop it, from the disk (a resume on a fresh node).

A state of ``--gib`` GiB of fp32 tensors (1,600 x 6,400 each, GPT-2 1.5B's MLP shape) goes through
``torch.save`` into files under ``--dir``: plain (no digest, left in the page cache), plain and
synced (``fsync``), through ``write_file`` with the
overlap, and with it off (every write hashed before the file takes it), alternating ``--repeat``
times, each file deleted and ``sync`` run before the next write, so that no variant inherits
another's dirty pages. Also: SHA-256 over the state's bytes alone, the host's CPU and the kernel's
dirty-page limits (which stop a writer at the disk's speed once the page cache holds that much).

    python benchmarks/checkpoint_write_probe.py [--gib 4] [--dir /tmp] [--out probe.json]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

_bench.setup_paths()

from tango_fairscale.parallel.checkpoint_format import torch_saving  # noqa: E402
from tango_fairscale.records import manifest  # noqa: E402


def state_of(gib: float) -> dict[str, torch.Tensor]:
    shape = (1600, 6400)
    count = max(1, round(gib * (1 << 30) / (shape[0] * shape[1] * 4)))
    generator = torch.Generator().manual_seed(0)
    return {f"w{index}": torch.randn(shape, generator=generator) for index in range(count)}


def timed_write(path: Path, state: dict[str, torch.Tensor], variant: str) -> float:
    subprocess.run(["sync"], check=False)
    started = time.perf_counter()
    if variant == "plain":
        torch.save(state, path)
    elif variant == "plain-fsync":
        with open(path, "wb") as file:
            torch.save(state, file)
            file.flush()
            os.fsync(file.fileno())
    else:
        overlapped = manifest._OVERLAPPED_BYTES
        if variant == "digest-serial":
            manifest._OVERLAPPED_BYTES = 1 << 62
        try:
            manifest.write_file(path, torch_saving(state))
        finally:
            manifest._OVERLAPPED_BYTES = overlapped
    seconds = time.perf_counter() - started
    path.unlink()
    return round(seconds, 3)


def serial_record(path: Path) -> str:
    """A file's SHA-256 read and hashed one chunk after the other (no overlap)."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(manifest._READ_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def drop_page_cache() -> bool:
    """Empty the kernel's page cache (root, where the container allows it): whether it did."""
    subprocess.run(["sync"], check=False)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def verify_seconds(path: Path, variant: str, cold: bool = False) -> float | None:
    if cold and not drop_page_cache():
        return None
    started = time.perf_counter()
    if variant == "overlapped":
        manifest.file_record(path)
    else:
        serial_record(path)
    return round(time.perf_counter() - started, 3)


def digest_seconds(state: dict[str, torch.Tensor]) -> float:
    digest = hashlib.sha256()
    started = time.perf_counter()
    for tensor in state.values():
        digest.update(tensor.numpy().data.cast("B"))
    return round(time.perf_counter() - started, 3)


def cpu_model() -> str | None:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return None
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else None


def vm_setting(name: str) -> str | None:
    try:
        return Path(f"/proc/sys/vm/{name}").read_text().strip()
    except OSError:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=4.0)
    parser.add_argument("--dir", type=Path, default=Path("/tmp"))
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("checkpoint_write_probe.json"))
    parser.add_argument("--commit", default=None, help="the commit measured (else BENCH_COMMIT)")
    args = parser.parse_args()

    state = state_of(args.gib)
    size = sum(tensor.numel() * tensor.element_size() for tensor in state.values())
    path = args.dir / "checkpoint_write_probe.pt"
    variants = ["plain", "plain-fsync", "digest-overlapped", "digest-serial"]
    seconds: dict[str, list[float]] = {variant: [] for variant in variants}
    for _ in range(args.repeat):
        for variant in variants:
            seconds[variant].append(timed_write(path, state, variant))
            print(variant, seconds[variant][-1], "s", flush=True)
    sha = [digest_seconds(state) for _ in range(2)]
    torch.save(state, path)  # read back from the page cache, as a resume right after a stop
    verify: dict[str, list[float | None]] = {}
    for _ in range(args.repeat):
        for variant in ("overlapped", "serial"):
            for cache in ("warm", "cold"):
                took = verify_seconds(path, variant, cold=cache == "cold")
                verify.setdefault(f"{variant}-{cache}", []).append(took)
    path.unlink()
    result = {
        "benchmark": "checkpoint_write_probe",
        "environment": _bench.environment(args.commit, query_gpu=torch.cuda.is_available()),
        "host": {
            "cpu": cpu_model(),
            "cpu_count": os.cpu_count(),
            "vm_dirty_ratio": vm_setting("dirty_ratio"),
            "vm_dirty_background_ratio": vm_setting("dirty_background_ratio"),
            "vm_dirty_bytes": vm_setting("dirty_bytes"),
        },
        "state_gb": round(size / 1e9, 3),
        "seconds": seconds,
        "gb_per_s": {v: round(size / 1e9 / min(s), 2) for v, s in seconds.items()},
        "sha256_alone_s": sha,
        "verify_s": verify,
        "sha256_gb_per_s": round(size / 1e9 / min(sha), 2),
    }
    _bench.write_json(args.out, result)
    print({k: result[k] for k in ("state_gb", "gb_per_s", "sha256_gb_per_s", "host")})


if __name__ == "__main__":
    main()
