"""Where the PIQA scoring step spends its time: ``torch.profiler`` over one warm step run.

Builds a GPT-2-shaped model (random init), runs ``PiqaPredictionsStep().run`` once to warm up,
then once under the profiler, and prints the step's wall time, the GPU's busy time (sum of kernel
times) and the top operators by CPU and by CUDA time. What the eval_speed.py table cannot say:
whether the step waits on the GPU (compute-bound) or the GPU waits on Python (overhead-bound).

    python benchmarks/eval_profile.py --piqa .gpudata/piqa --tokenizer .gpudata/gpt2-tokenizer \
        --precision bf16-mixed --batch-size 4096 --max-batch-tokens 16384
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

_bench.setup_paths()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _bench.add_data_arguments(parser)
    parser.add_argument("--precision", default="bf16-mixed")
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--max-batch-tokens", type=int, default=16384)
    parser.add_argument("--rows", type=int, default=25, help="operators listed per table")
    args = parser.parse_args()

    import torch
    from tango.common.dataset_dict import DatasetDict
    from torch.profiler import ProfilerActivity, profile

    from tango_fairscale.data import read_piqa
    from tango_fairscale.evaluation import PiqaPredictionsStep
    from tango_fairscale.model import ModelWrapper

    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    dataset = DatasetDict(splits={"validation": list(read_piqa(args.piqa)["validation"])})
    with torch.device(device):
        model = ModelWrapper(config=_bench.gpt2_config(args.shape), tokenizer=str(args.tokenizer))

    def step() -> None:
        PiqaPredictionsStep().run(
            model=model,
            dataset_dict=dataset,
            batch_size=args.batch_size,
            max_batch_tokens=args.max_batch_tokens,
            precision=args.precision,
        )
        if device.type == "cuda":
            torch.cuda.synchronize()

    step()
    begin = time.perf_counter()
    step()
    wall = time.perf_counter() - begin
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as profiler:
        step()
    events = profiler.key_averages()
    kernel_s = sum(e.self_device_time_total for e in events) / 1e6
    print(f"step wall {wall:.3f} s (unprofiled); GPU kernel time {kernel_s:.3f} s")
    print(events.table(sort_by="self_cpu_time_total", row_limit=args.rows))
    if device.type == "cuda":
        print(events.table(sort_by="self_cuda_time_total", row_limit=args.rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
