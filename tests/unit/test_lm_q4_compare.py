"""The whole decoder's half of the Q4MatMul graph's proof (infra.pack.lm_q4.compare) on made-up runs: the logits
within the tolerance of the largest, the tokens equal, and a later greedy step parting only on a near tie."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from infra.pack import lm_q4


def _step(*logits: float) -> tuple[int, Any]:
    values = np.array(logits, dtype=np.float32)
    return int(np.argmax(values)), values


REFERENCE = [[_step(10.0, 9.99, 0.0), _step(5.0, 4.9, 0.0), _step(0.0, 3.0, 1.0)]]  # near ties at 0 and 1


def test_equal_runs_pass_with_their_largest_difference() -> None:
    got = [[_step(10.0, 9.98, 0.0), _step(5.0, 4.9, 0.02), _step(0.0, 3.0, 1.0)]]
    result = lm_q4.compare(REFERENCE, got, [1])
    assert result["max_abs_logit_diff"] == pytest.approx(0.02, rel=1e-5)
    assert result["tolerance"] == pytest.approx(lm_q4.TOLERANCE * 10.0)
    assert result["parted_on_near_ties"] == []


def test_a_later_step_may_part_on_a_near_tie_and_the_rest_is_not_compared() -> None:
    # Step 1: the reference's margin 0.1 is below the 0.2 the logits moved: the rounding explains the other token.
    got = [[_step(10.0, 9.99, 0.0), _step(4.9, 5.0, 0.0), _step(9.0, 0.0, 0.0)]]
    assert lm_q4.compare(REFERENCE, got, [1])["parted_on_near_ties"] == [[0, 1]]


@pytest.mark.parametrize(
    ("got", "message"),
    [
        # The first step's token (the prompt's argmax) must be equal, even on a near tie (margin 0.01, moved 0.01).
        ([[_step(9.99, 10.0, 0.0), _step(5.0, 4.9, 0.0), _step(0.0, 3.0, 1.0)]], r"probe 0 .* step 0: token 1 != "),
        # Parted where the reference's margin (0.1) is above what the logits moved (0.08): not rounding.
        ([[_step(10.0, 9.99, 0.0), _step(4.96, 4.98, 0.0), _step(0.0, 3.0, 1.0)]], r"step 1: token 1 != .*0\.1"),
        # Tokens equal but the logits moved past the tolerance (0.5: 5% of the largest, 10).
        ([[_step(10.0, 9.99, 0.6), _step(5.0, 4.9, 0.0), _step(0.0, 3.0, 1.0)]], r"step 0: logits differ .* > the"),
        ([[_step(10.0, float("nan"), 0.0), _step(5.0, 4.9, 0.0), _step(0.0, 3.0, 1.0)]], "step 0: logits differ"),
    ],
)
def test_what_rounding_does_not_explain_is_refused(got: list[Any], message: str) -> None:
    with pytest.raises(lm_q4.LmQ4Error, match=message):
        lm_q4.compare(REFERENCE, got, [1])
