"""Helpers shared by the benchmark scripts (imported by path: ``benchmarks/`` is not a package).

FairScale's wheel installs a top-level package named ``benchmarks``, so this folder must never be
imported under that name. Each script puts this folder and the repository root on ``sys.path``
itself (:func:`setup_paths`) and is run by path: ``python benchmarks/train_speed.py ...``.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]

#: GPT-2 family shapes (random init from config; no pretrained weights exist offline).
SHAPES: dict[str, dict[str, int]] = {
    "124m": {"n_layer": 12, "n_embd": 768, "n_head": 12},
    "355m": {"n_layer": 24, "n_embd": 1024, "n_head": 16},
    "774m": {"n_layer": 36, "n_embd": 1280, "n_head": 20},
    "1.5b": {"n_layer": 48, "n_embd": 1600, "n_head": 25},
    # CPU smoke tests only.
    "tiny": {"n_layer": 2, "n_embd": 64, "n_head": 2},
}

#: Dense bf16 peak of one H200 (SXM), the MFU denominator.
PEAK_FLOPS = 989e12
MFU_FORMULA = (
    "(6 * n_params + 12 * n_layer * n_embd * seq_len) * tokens_per_s_per_gpu / 989e12; "
    "n_params = unique parameters (tied wte/lm_head counted once, wpe included); "
    "989e12 = H200 dense bf16 peak, used for every precision"
)

PRECISION_ALIASES = {
    "fp32": "32-true",
    "32": "32-true",
    "bf16": "bf16-mixed",
    "fp16": "16-mixed",
    "16": "16-mixed",
    "bf16true": "bf16-true",
}


def setup_paths() -> None:
    """Make ``tango_fairscale`` (the repository root) importable, ahead of installed copies."""
    root = str(REPO_ROOT)
    if root not in sys.path:
        sys.path.insert(0, root)


def register_components() -> None:
    """Register the package's Tango components (engines, model, steps) by importing every module:
    ``Lazy(TrainingEngine, Params({"type": "tango_fairscale::fsdp2", ...}))`` then resolves the
    name wherever the module that registers it lives."""
    from tango.common.util import import_module_and_submodules

    import_module_and_submodules("tango_fairscale")


def add_data_arguments(parser: Any, shape: str = "124m") -> None:
    """``--piqa``, ``--tokenizer`` (the carried ``.gpudata`` copies by default) and ``--shape``."""
    parser.add_argument("--piqa", type=Path, default=REPO_ROOT / ".gpudata" / "piqa")
    parser.add_argument("--tokenizer", type=Path, default=REPO_ROOT / ".gpudata" / "gpt2-tokenizer")
    parser.add_argument("--shape", default=shape, choices=sorted(SHAPES))


def gpt2_config(shape: str, n_positions: int = 1024) -> dict[str, Any]:
    """A ``tango_fairscale::causal_lm`` ``config``: GPT-2 defaults (dropout 0.1, vocab 50257)."""
    if shape not in SHAPES:
        raise SystemExit(f"unknown shape {shape!r}; choose from {', '.join(SHAPES)}")
    return {"model_type": "gpt2", "vocab_size": 50257, "n_positions": n_positions, **SHAPES[shape]}


def per_shape(value: str, shape: str, cast: type = int) -> Any:
    """``"16"`` -> 16 for every shape; ``"124m=16,1.5b=8"`` -> the entry for ``shape``.

    A mapping may give a fallback under ``*``; a shape missing with no fallback is an error.
    """
    if "=" not in value:
        return cast(value)
    entries = dict(item.split("=", 1) for item in value.split(",") if item)
    if shape in entries:
        return cast(entries[shape])
    if "*" in entries:
        return cast(entries["*"])
    raise SystemExit(f"no value for shape {shape!r} in {value!r} (add '{shape}=N' or '*=N')")


def git_commit(explicit: str | None) -> str:
    """``--commit`` / ``BENCH_COMMIT``, else ``git rev-parse HEAD``, else ``"unknown"``."""
    if explicit:
        return explicit
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    return _git("rev-parse", "HEAD") or "unknown"


def _git(*args: str) -> str | None:
    try:
        result = subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def source_digest() -> str:
    """SHA-256 over the package's ``.py`` files: identifies uncommitted code too."""
    digest = hashlib.sha256()
    for path in sorted((REPO_ROOT / "tango_fairscale").rglob("*.py")):
        digest.update(str(path.relative_to(REPO_ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _version(module: str) -> str | None:
    try:
        imported = __import__(module)
    except Exception:  # noqa: BLE001 - record what is missing, never fail here
        return None
    return str(getattr(imported, "__version__", "unknown"))


def environment(commit: str | None, query_gpu: bool = True) -> dict[str, Any]:
    """Software, hardware and code identity for a result file.

    ``query_gpu=False`` avoids creating a CUDA context in this process (a launcher of GPU
    workers); the GPU name then comes from :func:`gpu_info` run in a worker.
    """
    import torch

    status = _git("status", "--porcelain", "--", "tango_fairscale")
    info: dict[str, Any] = {
        "commit": git_commit(commit),
        # The benchmarks/gpu.sh suite that ran this (it sets BENCH_SUITE); None when run by hand.
        "suite": os.environ.get("BENCH_SUITE"),
        "package_dirty": None if status is None else bool(status),
        "package_source_sha256_16": source_digest(),
        "timestamp_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "transformers": _version("transformers"),
        "fairscale": _version("fairscale"),
        "tango": _tango_version(),
        "cpu_count": os.cpu_count(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "env": {
            k: os.environ[k]
            for k in sorted(os.environ)
            if k.startswith(("NCCL_", "CUDA_", "PYTHONPYCACHE", "PYTHONDONTWRITE"))
        },
        "argv": sys.argv,
    }
    info["gpu_count"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if query_gpu:
        info.update(gpu_info())
    return info


def _tango_version() -> str | None:
    try:
        from tango.version import VERSION

        return str(VERSION)
    except Exception:  # noqa: BLE001
        return None


def gpu_info() -> dict[str, Any]:
    """GPU name / count / NCCL version as seen by this process (creates a CUDA context)."""
    import torch

    if not torch.cuda.is_available():
        return {"gpu_name": None, "gpu_count": 0, "nccl": None}
    try:
        nccl = ".".join(str(x) for x in torch.cuda.nccl.version())
    except Exception:  # noqa: BLE001
        nccl = None
    return {
        "gpu_name": torch.cuda.get_device_name(0),
        "gpu_count": torch.cuda.device_count(),
        "gpu_memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1),
        "nccl": nccl,
    }


class GpuSampler(threading.Thread):
    """GPU 0's utilisation and memory every 100 ms (``nvidia-smi -lms``) on
    ``time.perf_counter``'s clock, until ``stopped`` is set; no samples without ``nvidia-smi``.

    Each sample is placed at the time ``nvidia-smi`` took it (its ``timestamp`` field), not when
    its line reached this process: a pipe may hand the lines over late and in bursts."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[tuple[float, float, float]] = []  # (time, util %, memory MiB)
        self.stopped = threading.Event()
        self.arrived: list[float] = []  # when each sample's line reached this process

    def run(self) -> None:
        query = "--query-gpu=timestamp,utilization.gpu,memory.used"
        command = ["nvidia-smi", query, "--format=csv,noheader,nounits", "-lms", "100", "-i", "0"]
        try:
            smi = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        except OSError:
            return
        assert smi.stdout is not None
        perf_minus_epoch = time.perf_counter() - time.time()
        for line in smi.stdout:
            if self.stopped.is_set():
                break
            try:
                stamp, util, memory = (field.strip() for field in line.split(","))
                taken = datetime.datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f").timestamp()
                self.samples.append((taken + perf_minus_epoch, float(util), float(memory)))
                self.arrived.append(time.perf_counter())
            except ValueError:
                continue
        smi.terminate()

    def busy(self, *windows: tuple[float, float], by_arrival: bool = False) -> float | None:
        """Mean utilisation (%) of the samples taken inside any of ``windows`` (start, end), or,
        ``by_arrival``, of those whose line arrived inside them (a check that the pipe's delay
        moves no sample into another window)."""
        times = self.arrived if by_arrival else [t for t, _, _ in self.samples]
        inside = [
            util
            for t, (_, util, _) in zip(times, self.samples)
            if any(a <= t <= b for a, b in windows)
        ]
        return round(sum(inside) / len(inside), 1) if inside else None

    def max_lag_s(self) -> float:
        """The longest a sample's line took to reach this process."""
        return max((a - t for a, (t, _, _) in zip(self.arrived, self.samples)), default=0.0)


def write_json(path: Path, data: Any) -> None:
    """Write atomically (a reader or a kill mid-write never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(data, indent=1, default=str) + "\n")
    os.replace(temporary, path)


def write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


#: GPU kernels by what they do, first match wins (names as cuBLAS, FlashAttention, cuDNN, NCCL,
#: Inductor and PyTorch's own kernels spell them on an H200 with torch 2.11).
KERNEL_KINDS: list[tuple[str, tuple[str, ...]]] = [
    ("communication", ("nccl",)),
    ("attention", ("flash", "fmha", "sdpa", "attention")),
    ("gemm", ("gemm", "nvjet", "cutlass", "xmma", "splitk")),
    ("optimizer", ("multi_tensor_apply", "adam")),
    ("compiled", ("triton",)),
    ("memcpy", ("memcpy", "memset")),
]
#: Kernels listed per profiled run by :func:`top_kernels`.
TOP_KERNELS = 25
#: Every kind :func:`kernel_kind` returns, in report order.
KERNEL_KIND_NAMES = tuple(kind for kind, _ in KERNEL_KINDS) + ("other",)


def kernel_kind(name: str) -> str:
    """``gemm``, ``attention``, ``compiled`` (Inductor's Triton kernels), ``optimizer``,
    ``communication``, ``memcpy`` or ``other`` (PyTorch's eager elementwise and reduction
    kernels) for one GPU kernel's name."""
    lowered = name.lower()
    return next((kind for kind, marks in KERNEL_KINDS if any(m in lowered for m in marks)), "other")


def kernel_totals(events: Any) -> dict[str, tuple[float, int]]:
    """Each GPU kernel's summed time (us) and launches, by name, from a
    ``torch.profiler.profile(...).events()`` list."""
    from torch.autograd import DeviceType

    totals: dict[str, tuple[float, int]] = {}
    for event in events:
        if event.device_type == DeviceType.CUDA:
            us, calls = totals.get(event.name, (0.0, 0))
            totals[event.name] = (us + event.time_range.elapsed_us(), calls + 1)
    return totals


def gpu_ms_by_kind(totals: dict[str, tuple[float, int]], steps: int) -> dict[str, float]:
    """Summed GPU kernel time per step (ms) by :func:`kernel_kind`, and ``busy`` (all kernels),
    from :func:`kernel_totals` of events covering ``steps`` steps."""
    by_kind = dict.fromkeys(KERNEL_KIND_NAMES, 0.0)
    for name, (us, _) in totals.items():
        by_kind[kernel_kind(name)] += us
    per_step = {kind: round(us / 1000 / steps, 3) for kind, us in by_kind.items()}
    per_step["busy"] = round(sum(by_kind.values()) / 1000 / steps, 3)
    return per_step


def top_kernels(
    totals: dict[str, tuple[float, int]], steps: int, count: int = TOP_KERNELS
) -> list[dict[str, Any]]:
    """The ``count`` GPU kernels that take the most time (:func:`kernel_totals` of events
    covering ``steps`` steps): each one's name (cut to 120 characters), kind, GPU ms and
    launches per step."""
    ranked = sorted(totals.items(), key=lambda item: -item[1][0])[:count]
    return [
        {
            "name": name[:120],
            "kind": kernel_kind(name),
            "ms": round(us / 1000 / steps, 3),
            "calls": round(calls / steps, 2),
        }
        for name, (us, calls) in ranked
    ]


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def gib(n_bytes: float | None) -> float | None:
    return None if n_bytes is None else round(n_bytes / 2**30, 2)


def is_oom(error: BaseException) -> bool:
    import torch

    if isinstance(error, torch.OutOfMemoryError):
        return True
    text = str(error)
    return "out of memory" in text.lower() or "can't allocate memory" in text


def short_error(error: BaseException, width: int = 400) -> str:
    text = " ".join(f"{type(error).__name__}: {error}".split())
    return text if len(text) <= width else text[: width - 3] + "..."
