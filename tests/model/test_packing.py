"""What a packed row's tokens may attend, and the load-time probe that packed queries score as
padded ones (``model/packing.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tango_fairscale.data.batches import packed_batch
from tango_fairscale.data.queries import Query
from tango_fairscale.model.causal_lm import ModelWrapper
from tango_fairscale.model.packing import packed_attention_mask, packing_matches_padding


def test_packed_attention_mask_keeps_queries_apart() -> None:
    # Queries 0 and 1 share the context (1, 2) but its last token; query 2 is alone; 6 inputs
    # padded to 8.
    queries = [Query((1, 2, 3, 4), 1), Query((1, 2, 3, 5, 6), 2), Query((8, 9), 1)]
    batch = packed_batch(queries, 0, width_multiple=4)
    assert batch["query_ids"].tolist() == [[-1, -1, 0, 1, 1, 2, -1, -1]]
    mask = packed_attention_mask(batch["position_ids"], batch["query_ids"])[0, 0].int()
    assert mask.tolist() == [
        [1, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 0],
        [1, 1, 0, 1, 0, 0, 0, 0],  # query 1 sees the shared context, not query 0
        [1, 1, 0, 1, 1, 0, 0, 0],
        [0, 0, 0, 0, 0, 1, 0, 0],  # a new segment
        [0, 0, 0, 0, 0, 0, 1, 0],  # padding sees itself only
        [0, 0, 0, 0, 0, 0, 0, 1],
    ]


class PackedDiffers(torch.nn.Module):
    """A model whose packed batches score 1.0 higher than padded ones, or that fails on them."""

    def __init__(self, fails: bool) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(()))
        self.fails = fails

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor, **batch: Any) -> dict:
        packed = "query_ids" in batch
        if packed and self.fails:
            raise ValueError("too many values to unpack")  # as Bloom's forward does
        rows = int(batch["query_ids"].max()) + 1 if packed else input_ids.shape[0]
        return {"loglikelihood": torch.full((rows,), 1.0 if packed else 0.0)}


def test_the_probe_says_whether_packed_queries_score_as_padded_ones(tiny_model_dir: Path) -> None:
    model = ModelWrapper(str(tiny_model_dir)).train()
    assert packing_matches_padding(model, model.pad_token_id)
    assert model.training  # every module's mode restored
    assert not packing_matches_padding(PackedDiffers(fails=False), 0)
    assert not packing_matches_padding(PackedDiffers(fails=True), 0)
