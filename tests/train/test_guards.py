"""What stops a run early: a loss past the divergence bound (unit and through the loop)."""

from __future__ import annotations

import math

import pytest

from tango_fairscale.train.guards import DivergedError, NonFiniteGuard


def test_a_loss_past_the_bound_is_divergence_on_its_step() -> None:
    guard = NonFiniteGuard(False, lambda step: [step * 10], vocab_size=1000)
    bound = NonFiniteGuard.DIVERGENCE * math.log(1000)
    guard.observe(1, 7.0)
    guard.observe(2, bound - 1)  # large, but within the bound
    with pytest.raises(DivergedError, match=r"loss 1\.7e\+08 at step 3 exceeds 10 x ln") as error:
        guard.observe(3, 1.7e8)
    assert "training examples: [20]" in str(error.value) and "\n" not in str(error.value)


def test_a_diverging_run_stops_instead_of_succeeding(tmp_path, tiny_model_dir, piqa_small) -> None:
    """lr 1000 sent a GPT-2's loss to 1.7e8 and the run ended "succeeded"."""
    from conftest import train_in

    with pytest.raises(DivergedError, match="training diverged"):
        train_in(
            tmp_path,
            tiny_model_dir,
            piqa_small,
            "tango_fairscale::ddp",
            1,
            20,
            optimizer={"type": "torch::AdamW", "lr": 1000.0},
            max_grad_norm=None,
        )
    assert not (tmp_path / "final_weights.pt").exists()
