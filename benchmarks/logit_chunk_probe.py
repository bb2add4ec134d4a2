"""Scoring speed against the loss's logit chunk size: does a chunk that stays in the GPU's L2 cache
make the vocabulary log-softmax cheaper than 4,096-row chunks of fp32 logits (0.8 GB each)?

The PIQA predictions step's path (``PiqaPredictionsStep().run``, all 3,676 validation queries, a
GPT-2 124M-shaped random-init model, ``bf16-mixed``, ``max_batch_tokens`` 16384, packed), the
fastest of ``--repeats`` after a warm-up, for each ``model.LOGIT_CHUNK_ROWS`` in ``--chunks``; the
scores' largest difference from the first chunk size's (the chunking must not change them).

    python benchmarks/logit_chunk_probe.py --piqa .gpudata/piqa --tokenizer .gpudata/gpt2-tokenizer
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

_bench.setup_paths()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _bench.add_data_arguments(parser)
    parser.add_argument("--chunks", default="4096,1024,512,256,128")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--examples", type=int, default=None, help="first N validation examples")
    args = parser.parse_args()

    import torch
    from tango.common.dataset_dict import DatasetDict

    from tango_fairscale import model as model_module
    from tango_fairscale.data import read_piqa
    from tango_fairscale.evaluation import PiqaPredictionsStep

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    examples = list(read_piqa(args.piqa, limit=args.examples)["validation"])
    with torch.device(device):
        model = model_module.ModelWrapper(
            config=_bench.gpt2_config(args.shape), tokenizer=str(args.tokenizer), seed=0
        ).eval()
    run = functools.partial(
        PiqaPredictionsStep().run,
        model=model,
        dataset_dict=DatasetDict(splits={"validation": examples}),
        batch_size=4096,
        max_batch_tokens=16384,
        precision="bf16-mixed",
        pack_sequences=True,
    )

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    def timed() -> tuple[list[float], float]:
        sync()
        begin = time.perf_counter()
        predictions = run()
        sync()
        scores = [ll for p in predictions for ll in p["loglikelihoods"]]
        return scores, time.perf_counter() - begin

    env = _bench.environment(None)
    print(
        f"# {' '.join(sys.argv)}\n# commit {env['commit']}; {env.get('gpu_name') or 'CPU'}; "
        f"torch {env['torch']}, transformers {env['transformers']}\n"
    )
    print("| logit chunk rows | step s (fastest) | queries/s | max abs score diff |")
    print("|---:|---:|---:|---:|")
    reference = None
    for rows in [int(c) for c in args.chunks.split(",")]:
        model_module.LOGIT_CHUNK_ROWS = rows
        timed()
        results = [timed() for _ in range(args.repeats)]
        scores, seconds = min(results, key=lambda result: result[1])
        reference = reference or scores
        diff = max(abs(a - b) for a, b in zip(scores, reference))
        queries_per_s = 2 * len(examples) / seconds
        print(f"| {rows} | {seconds:.4f} | {queries_per_s:,.0f} | {diff:.2e} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
