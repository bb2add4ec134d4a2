"""Tests of ``tango_fairscale.data``: PIQA instances → token queries → padded, packed batches.

The reference semantics are lm-evaluation-harness's: ``_encode_pair`` (trailing whitespace of the
context moves to the continuation; the continuation's tokens are the tokens of
``context + continuation`` after the context's own token count) and the left truncation of
``_loglikelihood_tokens`` to ``max_length + 1`` tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import choice_queries, training_queries
from tango.common.exceptions import ConfigurationError

from tango_fairscale.data.batches import (
    IGNORE_INDEX,
    collate,
    context_groups,
    packed_batch,
    segment_length,
    segment_pieces,
    segment_size,
)
from tango_fairscale.data.queries import Query, encode_pair
from tango_fairscale.data.schedules import BatchSchedule, length_sorted_batches, scoring_batches

BIG = 10_000  # a max_length no test sequence reaches


@pytest.fixture(scope="module")
def tokenizer(gpt2_tokenizer_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gpt2_tokenizer_dir))


def ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


# encode_pair ----------------------------------------------------------------------------------


def test_gpt2_tokenizer_is_the_real_one(tokenizer: Any) -> None:
    assert ids(tokenizer, "Hello world") == [15496, 995]


def test_encode_pair_plain_piqa_choice(tokenizer: Any) -> None:
    context = "Question: dresser\nAnswer:"
    query = encode_pair(tokenizer, context, " replace drawer with bobby pin ", BIG)
    # 'Question', ':', ' dress', 'er', '\n', 'Answer', ':' | ' replace', ' drawer', ' with', ' b',
    # 'obby', ' pin', ' '
    assert query == Query(
        (24361, 25, 6576, 263, 198, 33706, 25, 6330, 33451, 351, 275, 11369, 6757, 220), 7
    )
    assert len(query) == 14


def test_encode_pair_boundary_merge_takes_tokens_after_the_context_count(
    tokenizer: Any, hflm: Any
) -> None:
    context, continuation = "The cat sat on the ma", "ttress is soft"
    # Separately: ' ma' | 'tt', 'ress', ' is', ' soft'. Together ' ma' + 'ttress' merge into one
    # token ' mattress', so the continuation is what follows the context's 6 tokens: ' is', ' soft'.
    assert ids(tokenizer, context) == [464, 3797, 3332, 319, 262, 17266]
    assert ids(tokenizer, continuation) == [926, 601, 318, 2705]
    query = encode_pair(tokenizer, context, continuation, BIG)
    assert query.continuation_length == 2
    assert list(query.tokens[-query.continuation_length :]) == [318, 2705]
    _, continuation_enc = hflm._encode_pair(context, continuation)
    assert continuation_enc == [318, 2705]


def test_encode_pair_feeds_lm_evals_context_tokens_at_a_merged_boundary(
    tokenizer: Any, hflm: Any
) -> None:
    # lm-eval's _loglikelihood_tokens scores (context_enc + continuation_enc)[-(max_length+1):].
    context, continuation = "The cat sat on the ma", "ttress is soft"
    context_enc, continuation_enc = hflm._encode_pair(context, continuation)
    assert context_enc + continuation_enc == [464, 3797, 3332, 319, 262, 17266, 318, 2705]
    query = encode_pair(tokenizer, context, continuation, BIG)
    assert query == Query(tuple(context_enc + continuation_enc), len(continuation_enc))


@pytest.mark.parametrize(
    "context, continuation, moved_context, moved_continuation",
    [
        ("Answer: ", "yes", "Answer:", " yes"),
        ("Answer:  ", "yes", "Answer:", "  yes"),
        ("Answer:\n", "yes", "Answer:", "\nyes"),
        ("Answer: \t", " yes", "Answer:", " \t yes"),
    ],
)
def test_encode_pair_moves_trailing_whitespace_of_context_to_continuation(
    tokenizer: Any,
    hflm: Any,
    context: str,
    continuation: str,
    moved_context: str,
    moved_continuation: str,
) -> None:
    query = encode_pair(tokenizer, context, continuation, BIG)
    assert query == encode_pair(tokenizer, moved_context, moved_continuation, BIG)
    whole = ids(tokenizer, moved_context + moved_continuation)
    assert query == Query(tuple(whole), len(whole) - len(ids(tokenizer, moved_context)))
    context_enc, continuation_enc = hflm._encode_pair(context, continuation)
    assert query == Query(tuple(context_enc + continuation_enc), len(continuation_enc))


def test_encode_pair_trailing_space_example_by_ids(tokenizer: Any) -> None:
    # Without the move, "Answer: " would end in a lone ' ' token and " yes" would lose its space.
    assert ids(tokenizer, "Answer: ") == [33706, 25, 220]
    assert encode_pair(tokenizer, "Answer: ", "yes", BIG) == Query((33706, 25, 3763), 1)


def test_encode_pair_rejects_a_continuation_with_no_tokens_of_its_own(tokenizer: Any) -> None:
    # "Hello wor" + "ld" is 2 tokens, as many as "Hello wor" alone: nothing would be scored.
    with pytest.raises(ValueError, match="encodes to no tokens"):
        encode_pair(tokenizer, "Hello wor", "ld", BIG)


def test_choice_queries_match_lm_eval_on_all_piqa_validation_examples(
    tokenizer: Any, piqa_dir: Path, hflm: Any
) -> None:
    """lm-eval's ``piqa`` requests of every official validation example, encoded, equal lm-eval's
    HF backend's own ``_encode_pair`` of them."""
    examples = [json.loads(line) for line in (piqa_dir / "valid.jsonl").read_text().splitlines()]
    assert len(examples) == 1838
    examples = [{**example, "label": 0} for example in examples]
    expected = []
    for example in examples:
        context = f"Question: {example['goal']}\nAnswer:"
        for solution in (example["sol1"], example["sol2"]):
            context_enc, continuation_enc = hflm._encode_pair(context, " " + solution)
            expected.append(Query(tuple(context_enc + continuation_enc), len(continuation_enc)))
    assert choice_queries(examples, tokenizer, BIG) == expected


# Left truncation ------------------------------------------------------------------------------


def test_left_truncation_keeps_the_last_max_length_plus_one_tokens(tokenizer: Any) -> None:
    context, continuation = "The cat sat on the", " mattress is soft"
    whole = (464, 3797, 3332, 319, 262, 33388, 318, 2705)
    for max_length in (7, 8, 100):  # no truncation: 8 tokens fit in max_length + 1
        assert encode_pair(tokenizer, context, continuation, max_length) == Query(whole, 3)
    assert encode_pair(tokenizer, context, continuation, 6) == Query(whole[-7:], 3)
    assert encode_pair(tokenizer, context, continuation, 3) == Query(whole[-4:], 3)
    # The model predicts at most max_length tokens: a longer continuation is scored on those
    # (lm-eval asserts len(continuation_enc) <= max_length instead).
    assert encode_pair(tokenizer, context, continuation, 2) == Query(whole[-3:], 2)
    assert encode_pair(tokenizer, context, continuation, 1) == Query(whole[-2:], 1)


def test_left_truncation_of_a_long_continuation(tokenizer: Any) -> None:
    context = "Question: how?\nAnswer:"
    continuation = " one two three four five six seven eight nine ten"
    whole = ids(tokenizer, context + continuation)
    continuation_length = len(whole) - len(ids(tokenizer, context))
    assert continuation_length == 10
    assert encode_pair(tokenizer, context, continuation, 12) == Query(tuple(whole[-13:]), 10)
    # lm-eval window (context + continuation)[-(max_length + 1):]; 5 predictable tokens.
    assert encode_pair(tokenizer, context, continuation, 5) == Query(tuple(whole[-6:]), 5)


# choice_queries / training_queries -------------------------------------------------------------


EXAMPLES = [
    {"goal": "open a jar", "sol1": "twist the lid", "sol2": "hit it ", "label": 1},
    {"goal": "dresser", "sol1": "replace drawer with bobby pin ", "sol2": "pin", "label": 0},
]


def test_choice_queries_are_both_choices_in_order(tokenizer: Any) -> None:
    queries = choice_queries(EXAMPLES, tokenizer, BIG)
    expected = [
        encode_pair(tokenizer, f"Question: {example['goal']}\nAnswer:", " " + example[key], BIG)
        for example in EXAMPLES
        for key in ("sol1", "sol2")
    ]
    assert queries == expected


def test_training_queries_take_the_correct_choice(tokenizer: Any) -> None:
    queries = training_queries(EXAMPLES, tokenizer, BIG)
    assert queries == [
        encode_pair(tokenizer, "Question: open a jar\nAnswer:", " hit it ", BIG),
        encode_pair(
            tokenizer, "Question: dresser\nAnswer:", " replace drawer with bobby pin ", BIG
        ),
    ]
    # Refused when the task is loaded (the helper scores the same document): documents.py.
    with pytest.raises(ConfigurationError, match="is -1, not the index of one of its 2 choices"):
        training_queries([{**EXAMPLES[0], "label": -1}], tokenizer, BIG)


# collate --------------------------------------------------------------------------------------


def test_collate_right_pads_and_labels_only_continuations() -> None:
    queries = [Query((5, 6, 7, 8), 2), Query((9, 10), 1), Query((11, 12, 13, 14, 15), 5)]
    batch = collate(queries, pad_token_id=0)
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    assert all(tensor.dtype == torch.long for tensor in batch.values())
    assert batch["input_ids"].tolist() == [
        [5, 6, 7, 8, 0],
        [9, 10, 0, 0, 0],
        [11, 12, 13, 14, 15],
    ]
    assert batch["attention_mask"].tolist() == [
        [1, 1, 1, 1, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 1, 1],
    ]
    x = IGNORE_INDEX
    assert batch["labels"].tolist() == [
        [x, x, 7, 8, x],
        [x, 10, x, x, x],
        [11, 12, 13, 14, 15],
    ]


def test_collate_pad_id_is_never_a_label() -> None:
    # Padding with a real token id (GPT-2 pads with end-of-text) must not leak into labels,
    # even when that id also occurs inside a continuation.
    batch = collate([Query((3, 50256), 1), Query((1, 2, 3, 4), 1)], pad_token_id=50256)
    assert batch["input_ids"].tolist() == [[3, 50256, 50256, 50256], [1, 2, 3, 4]]
    assert batch["labels"].tolist() == [
        [IGNORE_INDEX, 50256, IGNORE_INDEX, IGNORE_INDEX],
        [IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX, 4],
    ]
    assert batch["attention_mask"].sum().item() == 6


# packed_batch ---------------------------------------------------------------------------------


def test_packed_batch_shares_a_common_context_and_fills_rows_longest_first() -> None:
    x = IGNORE_INDEX
    queries = [
        Query((1, 2, 3, 4, 5), 2),  # context (1, 2, 3) ...
        Query((9, 8, 7), 1),
        Query((1, 2, 3, 7), 1),  # ... shared with query 0: (1, 2) once, then (3,)
        Query((5, 5, 5, 5, 5, 5), 3),
    ]
    batch = packed_batch(queries, pad_token_id=0, width_multiple=8)
    assert set(batch) == {"input_ids", "attention_mask", "labels", "position_ids", "query_ids"}
    # Shifted rows (input t predicts labels[t]); segments longest first, ties by first query:
    # queries 0 and 2 (5 inputs), 3 (5), 1 (2); 12 inputs padded to 16.
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 3, 5, 5, 5, 5, 5, 9, 8, 0, 0, 0, 0]]
    assert batch["labels"].tolist() == [[x, x, 4, 5, 7, x, x, 5, 5, 5, x, 7, x, x, x, x]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 2, 0, 1, 2, 3, 4, 0, 1, 0, 0, 0, 0]]
    assert batch["query_ids"].tolist() == [[-1, -1, 0, 0, 2, 3, 3, 3, 3, 3, 1, 1, -1, -1, -1, -1]]
    assert batch["attention_mask"].tolist() == [[1] * 12 + [0] * 4]


def test_packed_batch_rows_hold_at_most_the_row_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    from tango_fairscale.data import batches

    monkeypatch.setattr(batches, "PACKED_ROW_TOKENS", 10)
    queries = [Query(tuple(range(100 + i, 104 + i)), 1) for i in range(5)]  # 3 inputs each
    queries.append(Query(tuple(range(12)), 2))  # 11 inputs, past the budget: a row of its own
    batch = packed_batch(queries, pad_token_id=0)
    # Capacity = max(budget, longest) = 11: rows [11], [3, 3, 3], [3, 3] (next fit).
    assert batch["input_ids"].shape == (3, 11)
    assert batch["query_ids"][:, 0].tolist() == [5, 0, 3]
    assert batch["attention_mask"].sum(dim=1).tolist() == [11, 9, 6]
    # Every query's inputs, positions and scored targets appear once, as in its own row.
    for index, query in enumerate(queries):
        mine = batch["query_ids"] == index
        assert batch["input_ids"][mine].tolist() == list(query.tokens[:-1])
        assert batch["position_ids"][mine].tolist() == list(range(len(query) - 1))
        scored = batch["labels"][mine][batch["labels"][mine] != IGNORE_INDEX]
        assert scored.tolist() == list(query.tokens[-query.continuation_length :])


def test_packed_batch_never_shares_a_scored_token() -> None:
    """A one-token context is not shared (nothing is left before the branch point), and a
    shared context ends one token before the first scored target of every member."""
    tiny = packed_batch([Query((7, 1), 1), Query((7, 2), 1)], pad_token_id=0)
    assert tiny["query_ids"].tolist() == [[0, 1]]
    assert tiny["position_ids"].tolist() == [[0, 0]]
    assert tiny["labels"].tolist() == [[1, 2]]
    pair = packed_batch([Query((7, 8, 1, 2), 2), Query((7, 8, 3), 1)], pad_token_id=0)
    shared = pair["query_ids"] == -1
    assert pair["input_ids"][shared].tolist() == [7]
    assert pair["labels"].tolist() == [[IGNORE_INDEX, 1, 2, 3]]


def test_packed_training_batches_feed_multiples_of_64_positions() -> None:
    from tango_fairscale.data.batches import training_batch

    queries = [Query(tuple(range(n)), 2) for n in (30, 40, 50)]
    batch = training_batch(queries, 0, max_length=1023, packed=True)
    assert batch["input_ids"].shape == (1, 128)  # 117 inputs
    assert batch["attention_mask"].sum() == 117


def test_packed_scoring_batches_keep_a_context_together() -> None:
    context = (1, 2, 3)
    queries = [
        Query(context + (4,), 1),
        Query((9,) * 20, 1),
        Query(context + (5, 6), 2),
        Query((8, 8), 1),
    ]
    # Inputs per segment: query 1: 19; queries 0 and 2: 2 shared + 1 + 2 = 5; query 3: 1.
    assert scoring_batches(queries, 3, packed=True) == [[1, 0, 2], [3]]
    assert scoring_batches(queries, 3, max_tokens=20, packed=True) == [[1], [0, 2, 3]]
    # A group larger than batch_size is split (query 2 alone: 4 inputs, query 0: 3).
    assert scoring_batches(queries, 1, packed=True) == [[1], [2], [0], [3]]
    # Unpacked: length_sorted_batches.
    assert scoring_batches(queries, 3) == length_sorted_batches(queries, 3)


def test_context_groups_gather_equal_contexts_wherever_they_are() -> None:
    queries = [
        Query((1, 2, 3, 4), 1),
        Query((1, 2, 3, 5, 6), 2),  # the same context, next to it
        Query((7, 8), 1),
        Query((1, 2, 3, 9), 1),  # the first context again, after another
        Query((1, 2, 4), 1),  # a context that begins the first one's: another group
        Query((1, 2, 5), 1),
    ]
    assert context_groups(queries) == [[0, 1, 3], [2], [4, 5]]


def test_a_segments_size_is_the_places_its_pieces_take(tokenizer: Any, piqa_small: Any) -> None:
    queries = choice_queries(list(piqa_small["validation"])[:20], tokenizer, 1024)
    queries += [Query((7, 8, 9), 1), Query((7, 8, 5, 6), 2), Query((4, 5, 6), 1)]  # (7, 8) shared
    for members in context_groups(queries):
        size = segment_size(queries, members)
        assert size == segment_length(segment_pieces(queries, members))
        assert size == int(packed_batch([queries[i] for i in members], 0)["attention_mask"].sum())


# length_sorted_batches ------------------------------------------------------------------------


def test_length_sorted_batches_longest_first_ties_by_index() -> None:
    lengths = [3, 7, 3, 9, 1, 7, 3]
    queries = [Query(tuple(range(n)), 1) for n in lengths]
    batches = length_sorted_batches(queries, 3)
    assert batches == [[3, 1, 5], [0, 2, 6], [4]]
    flat = [i for batch in batches for i in batch]
    assert sorted(flat) == list(range(len(queries)))
    assert [lengths[i] for i in flat] == sorted(lengths, reverse=True)


def test_length_sorted_batches_sizes() -> None:
    queries = [Query((1, 2), 1)] * 10
    assert [len(b) for b in length_sorted_batches(queries, 4)] == [4, 4, 2]
    assert length_sorted_batches(queries, 10) == [list(range(10))]
    assert length_sorted_batches(queries, 64) == [list(range(10))]
    assert length_sorted_batches([], 4) == []


def test_length_sorted_batches_token_budget() -> None:
    """``max_tokens`` caps queries × longest: long queries share few batches, short ones many."""
    lengths = [10, 10, 10, 4, 4, 4, 4, 4, 25]
    queries = [Query(tuple(range(n)), 1) for n in lengths]
    batches = length_sorted_batches(queries, 100, max_tokens=20)
    assert batches == [[8], [0, 1], [2, 3], [4, 5, 6, 7]]  # 25 > 20: a batch of its own
    assert all(len(b) * lengths[b[0]] <= 20 for b in batches[1:])
    assert length_sorted_batches(queries, 3, max_tokens=1000) == length_sorted_batches(queries, 3)


# BatchSchedule --------------------------------------------------------------------------------


def test_schedule_is_a_deterministic_function_of_the_step() -> None:
    a = BatchSchedule(num_examples=50, batch_size=8, seed=3)
    b = BatchSchedule(num_examples=50, batch_size=8, seed=3)
    assert [a.global_batch(s) for s in range(20)] == [b.global_batch(s) for s in range(20)]
    # Asking out of order (as a resumed run does) gives the same answer.
    assert a.global_batch(13) == b.global_batch(13)
    assert BatchSchedule(50, 8, seed=4).global_batch(0) != a.global_batch(0)


def test_schedule_epochs_are_permutations_dropping_the_last_partial_batch() -> None:
    schedule = BatchSchedule(num_examples=50, batch_size=8, seed=0)
    assert schedule.steps_per_epoch == 6
    for epoch in range(3):
        steps = range(epoch * 6, (epoch + 1) * 6)
        seen = [i for step in steps for i in schedule.global_batch(step)]
        assert len(seen) == 48 == len(set(seen))
        assert all(0 <= i < 50 for i in seen)
    first = [schedule.global_batch(s) for s in range(6)]
    second = [schedule.global_batch(s) for s in range(6, 12)]
    assert first != second  # each epoch is shuffled afresh


@pytest.mark.parametrize("world_size, grad_accum", [(1, 1), (1, 4), (2, 1), (2, 2), (4, 1), (8, 1)])
def test_schedule_global_batch_does_not_depend_on_world_size(
    world_size: int, grad_accum: int
) -> None:
    reference = BatchSchedule(num_examples=37, batch_size=8, seed=11)
    for step in (0, 1, 4, 5, 17):
        parts = []
        for rank in range(world_size):
            schedule = BatchSchedule(37, 8, 11, world_size, rank, grad_accum)
            micro_batches = schedule.micro_batches(step)
            assert len(micro_batches) == grad_accum
            assert all(len(m) == 8 // (world_size * grad_accum) for m in micro_batches)
            assert schedule.global_batch(step) == reference.global_batch(step)
            parts.extend(i for micro_batch in micro_batches for i in micro_batch)
        # Rank r's micro-batches are the r-th contiguous slice of the global batch, in order.
        assert parts == reference.global_batch(step)


def test_schedule_divisibility_error_says_what_to_change() -> None:
    with pytest.raises(ValueError) as err:
        BatchSchedule(num_examples=100, batch_size=10, seed=0, world_size=2, grad_accum=2)
    assert str(err.value) == (
        "batch_size 10 must be divisible by device_count × grad_accum = 4; "
        "change batch_size to a multiple of 4"
    )
    with pytest.raises(ValueError, match="batch_size 6 must be divisible by .* = 4"):
        BatchSchedule(100, 6, 0, world_size=4)
    BatchSchedule(100, 12, 0, world_size=2, grad_accum=3)  # 12 = 2 × 3 × 2 is fine


def test_schedule_too_few_examples() -> None:
    with pytest.raises(ValueError) as err:
        BatchSchedule(num_examples=5, batch_size=8, seed=0)
    assert str(err.value) == (
        "only 5 training examples for batch_size 8; raise limit or lower batch_size"
    )


def test_training_batches_pad_to_few_widths_within_the_window() -> None:
    from tango_fairscale.data.batches import training_batch

    short, long = Query((1, 2, 3), 1), Query(tuple(range(100)), 5)
    assert training_batch([short], 0, max_length=1023)["input_ids"].shape == (1, 64)
    assert training_batch([short, long], 0, max_length=1023)["input_ids"].shape == (2, 128)
    # Never wider than the model's window (max_length + 1 tokens).
    assert training_batch([long], 0, max_length=110)["input_ids"].shape == (1, 111)
    assert training_batch([short], 0, max_length=40)["input_ids"].shape == (1, 41)
