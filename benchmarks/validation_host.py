"""In-loop validation's host time: ``Evaluator.evaluate`` over lm-eval's ``piqa`` on the official
validation files (1,838 documents, 3,676 requests), as the training loop validates, timed around
the model's forwards: the total, the forwards and the rest (the host: lm-eval's requests and
metrics, encoding, batching). ``--rebuild``: every validation builds its requests and logs samples
again (the loop before ``harness.requests_built_once``); the figures are checked equal.

    python benchmarks/validation_host.py --piqa DATA/piqa

The model is the first run's (``tango-fairscale tiny-model``: 2 layers, a byte-level tokenizer).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--piqa", type=Path, required=True)
    parser.add_argument("--validations", type=int, default=4)
    parser.add_argument("--rebuild", action="store_true", help="requests rebuilt every time")
    args = parser.parse_args()

    import torch

    from tango_fairscale.evaluation.call import EvalOptions, ModelCall
    from tango_fairscale.evaluation.evaluator import Evaluator
    from tango_fairscale.evaluation.harness import merge, requests_built_once, summary
    from tango_fairscale.model.causal_lm import ModelWrapper
    from tango_fairscale.model.tiny import save_tiny_model
    from tango_fairscale.tasks.lm_eval import TaskSpec, load_tasks
    from tango_fairscale.tasks.piqa import read_piqa

    model = ModelWrapper(str(save_tiny_model(Path(tempfile.mkdtemp()) / "model"))).eval()
    spec = TaskSpec(name="piqa", dataset=read_piqa(args.piqa))
    loaded = load_tasks(spec) if args.rebuild else requests_built_once(load_tasks(spec))
    local = ModelCall.local(model, torch.device("cpu"))
    forward_s = [0.0]

    def forward(batch: dict[str, Any]) -> Any:
        started = time.perf_counter()
        with torch.no_grad():
            outputs = local(batch)
        forward_s[0] += time.perf_counter() - started
        return outputs

    options = EvalOptions(batch_size=256, max_batch_tokens=16384, packed=True, progress=False)
    evaluator = Evaluator(ModelCall(forward, model, torch.device("cpu")), options)
    figures = []
    for index in range(args.validations):
        forward_s[0] = 0.0
        started = time.perf_counter()
        scores = evaluator.evaluate(spec, loaded, samples=args.rebuild)
        total = time.perf_counter() - started
        figures.append(summary(merge([scores])))
        print(
            f"validation {index + 1}: {total:.2f} s, forwards {forward_s[0]:.2f} s, "
            f"host {total - forward_s[0]:.2f} s",
            flush=True,
        )
    assert all(figure == figures[0] for figure in figures), "validations disagree"
    print(f"acc {figures[0]['acc']:.6f}, acc_norm {figures[0]['acc_norm']:.6f}")


if __name__ == "__main__":
    main()
