"""The adaptive KL coefficient that PPO and APPO share (policy_service/policy/adaptive_kl.py)."""

import math

import numpy as np
import pytest

from policy_service.policy.adaptive_kl import AdaptiveKLCoefficient


def test_the_coefficient_follows_the_kl_target_by_hand():
    coeff = AdaptiveKLCoefficient(0.2, target=0.01, device="/cpu:0")
    # above 2 * target: x1.5; below target / 2: x0.5; in between: kept
    kls, expected, value = [0.03, 0.03, 0.015, 0.001, 0.02], [], 0.2
    for kl in kls:
        value = value * 1.5 if kl > 0.02 else value * 0.5 if kl < 0.005 else value
        expected.append(value)
    got = [coeff.update(kl) for kl in kls]
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert float(coeff.variable.numpy()) == pytest.approx(expected[-1], rel=1e-6)


def test_state_round_trips_and_an_absent_entry_changes_nothing():
    source = AdaptiveKLCoefficient(0.2, target=0.01, device="/cpu:0")
    source.update(1.0)
    target = AdaptiveKLCoefficient(0.2, target=0.01, device="/cpu:0")
    target.set_state(source.get_state())
    assert target.get_state() == source.get_state() == {"kl_coeff": pytest.approx(0.3)}
    target.set_state({})
    assert target.get_state() == source.get_state()


@pytest.mark.parametrize("bad", [-0.5, math.nan, math.inf, True, "0.2"])
def test_a_bad_state_entry_is_one_line_naming_it(bad):
    with pytest.raises(ValueError, match=r"^policy state entry 'kl_coeff' must be a finite"):
        AdaptiveKLCoefficient.check_state({"kl_coeff": bad})
    AdaptiveKLCoefficient.check_state({})  # optional: older states have none
