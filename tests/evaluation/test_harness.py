"""``evaluation/harness.py``'s conversion of lm-eval's output to JSON's types."""

from __future__ import annotations

import json
import math

import numpy as np

from tango_fairscale.evaluation.harness import json_safe


def test_json_safe_makes_lm_evals_values_jsons() -> None:
    value = {
        "acc": np.float64(0.5),
        "n": np.int64(3),
        "greedy": np.bool_(True),
        "flag": False,
        "resps": [[(-1.5, True)], [(float("nan"), False)]],
        "stderr": float("inf"),
        1: "one",
        "missing": None,
        "other": object,
    }
    safe = json_safe(value)
    assert safe["resps"] == [[[-1.5, True]], [[None, False]]]
    assert safe["stderr"] is None and safe["missing"] is None and safe["1"] == "one"
    assert (type(safe["acc"]), type(safe["n"]), type(safe["greedy"])) == (float, int, bool)
    assert safe["flag"] is False and safe["other"] == str(object)
    assert json.loads(json.dumps(safe, allow_nan=False)) == safe
    assert not any(isinstance(v, float) and math.isnan(v) for v in safe.values())
