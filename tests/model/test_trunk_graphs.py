"""Scoring forwards' trunk replayed from CUDA graphs (``model/trunk_graphs.py``): a packed batch
padded to its replayed shape gives its real tokens the hidden states they have unpadded (on the
CPU), and on a GPU the scores of a task replayed equal its eager scores, with graphs captured
for the shapes that came twice."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tango_fairscale.data.batches import PACKED_ROW_TOKENS, packed_batch
from tango_fairscale.data.queries import Query
from tango_fairscale.model.causal_lm import ModelWrapper
from tango_fairscale.model.trunk_graphs import (
    ROW_MULTIPLE,
    TrunkGraphs,
    load_padded,
    padded_shape,
    replayed_trunks,
)

GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs run on GPUs")


def queries(count: int, seed: int = 0) -> list[Query]:
    generator = torch.Generator().manual_seed(seed)
    made = []
    for _ in range(count):
        context = torch.randint(0, 250, (int(torch.randint(3, 40, (1,), generator=generator)),))
        for _ in range(2):
            ending = torch.randint(0, 250, (int(torch.randint(1, 9, (1,), generator=generator)),))
            made.append(Query(tuple(context.tolist() + ending.tolist()), len(ending)))
    return made


def test_padded_shapes() -> None:
    assert padded_shape(1, 7) == (ROW_MULTIPLE, PACKED_ROW_TOKENS)
    assert padded_shape(ROW_MULTIPLE, PACKED_ROW_TOKENS) == (ROW_MULTIPLE, PACKED_ROW_TOKENS)
    assert padded_shape(ROW_MULTIPLE + 1, PACKED_ROW_TOKENS + 1) == (
        2 * ROW_MULTIPLE,
        2 * PACKED_ROW_TOKENS,
    )


def test_padding_leaves_the_real_tokens_hidden_states_as_they_were(tiny_model_dir: Path) -> None:
    model = ModelWrapper(str(tiny_model_dir)).eval()
    batch = packed_batch(queries(8), model.pad_token_id, width_multiple=8)
    inputs = tuple(batch[key] for key in ("input_ids", "position_ids", "query_ids"))
    rows, width = inputs[0].shape
    assert rows % ROW_MULTIPLE and width < PACKED_ROW_TOKENS  # padded both ways
    padded = tuple(torch.empty(padded_shape(rows, width), dtype=torch.long) for _ in inputs)
    load_padded(padded, inputs)
    with torch.no_grad():
        alone = model.packed_hidden(*inputs)
        within = model.packed_hidden(*padded)[:rows, :width]
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(within[real], alone[real], rtol=1e-5, atol=1e-5)


def test_replayed_trunks_leave_a_cpu_model_eager(tiny_model_dir: Path) -> None:
    model = ModelWrapper(str(tiny_model_dir))
    with replayed_trunks(model):
        assert model.replayed_trunk is None


@GPU
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_replayed_scores_equal_eager_ones_on_a_gpu(tiny_model_dir: Path, dtype) -> None:
    model = ModelWrapper(str(tiny_model_dir)).eval().cuda()
    batches = [packed_batch(queries(30, seed), model.pad_token_id, 8) for seed in (0, 0, 1, 0)]
    on_gpu = [
        {k: v if k in ("labels", "query_ids") else v.cuda() for k, v in b.items()} for b in batches
    ]

    def scores() -> list[torch.Tensor]:
        with torch.no_grad(), torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
            return [model(**batch)["loglikelihood"].cpu() for batch in on_gpu]

    eager = scores()
    with replayed_trunks(model):
        graphs = model.replayed_trunk
        assert isinstance(graphs, TrunkGraphs)
        replayed = scores()
        assert [graph is not None for graph in graphs.graphs.values()] == [True]  # came twice
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    for ours, theirs in zip(replayed, eager, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=tolerance, atol=tolerance)
    assert model.replayed_trunk is None
