"""Example data for Tango's ``torch::train`` with a tango_fairscale engine: PIQA examples (from the
``tango_fairscale::piqa`` step) → right-padded training batches, as a Tango ``DataCollator``.

``torch::train`` feeds its ``DataLoader``'s batches to the engine, and our model takes a batch of
``input_ids``, ``attention_mask`` and ``labels`` (the continuation's tokens, ``-100`` elsewhere):
the loss is the correct answer's cross-entropy, as in ``tango_fairscale::train``. Use it with
``tango run ... -i examples/torch_train_piqa.py`` (see ``torch_train_fairscale.jsonnet``).
"""

from __future__ import annotations

from typing import Any

from tango.integrations.torch import DataCollator

from tango_fairscale.data.batches import training_batch
from tango_fairscale.data.queries import encode_pairs
from tango_fairscale.model.loading import context_length, load_config, load_tokenizer


@DataCollator.register("examples::piqa_training_batches")
class PiqaTrainingBatches(DataCollator[dict[str, Any]]):
    """``{"goal", "sol1", "sol2", "label"}`` examples → one batch scoring the correct choice,
    prompted as lm-eval's ``piqa`` task (``"Question: {goal}\\nAnswer:"``, ``" " + sol``).

    :param model: hub id or directory of the model: its tokenizer encodes the examples, and its
        context is the longest batch row (longer examples are left-truncated).
    """

    def __init__(self, model: str) -> None:
        self.tokenizer = load_tokenizer(model)
        # Padding is never attended to or scored: any token id serves.
        self.pad_token_id = self.tokenizer.pad_token_id or self.tokenizer.eos_token_id or 0
        self.max_length = context_length(load_config(model), self.tokenizer)

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        pairs = [
            (f"Question: {item['goal']}\nAnswer:", " " + item[f"sol{item['label'] + 1}"])
            for item in items
        ]
        queries = encode_pairs(self.tokenizer, pairs, self.max_length)
        return training_batch(queries, self.pad_token_id, self.max_length)
