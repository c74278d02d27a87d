"""Faro utilities, penalty multiplier and the five cluster objectives."""

import numpy as np
import pytest

from agent.coordinator.faro.objectives import (
    DROP_GRID,
    cluster_objective,
    penalty,
    relaxed_penalty_multiplier,
    step_penalty_multiplier,
)
from agent.coordinator.faro.utility import relaxed_utility, step_utility


def test_utilities():
    assert step_utility(0.5, 0.6) == 1.0 and step_utility(0.7, 0.6) == 0.0
    assert relaxed_utility(0.5, 0.6, 1.0) == 1.0
    assert relaxed_utility(1.2, 0.6, 1.0) == pytest.approx(0.5)
    assert relaxed_utility(1.2, 0.6, 2.0) == pytest.approx(0.25)
    assert relaxed_utility(float("inf"), 0.6, 1.0) == 0.0


def test_aws_penalty_table():
    assert [penalty(a) for a in (1.0, 0.99, 0.98, 0.95, 0.93, 0.90, 0.5)] == [
        0.0, 0.0, 0.25, 0.25, 0.5, 0.5, 1.0]


def test_relaxed_penalty_is_piecewise_linear_upper_envelope():
    for d in np.linspace(0.0, 1.0, 1001):
        assert relaxed_penalty_multiplier(d) >= step_penalty_multiplier(d) - 1e-12
    for d, phi in [(0.0, 1.0), (0.01, 1.0), (0.05, 0.75), (0.10, 0.5), (0.2, 0.0)]:
        assert relaxed_penalty_multiplier(d) == pytest.approx(phi)
        assert d in DROP_GRID
    assert relaxed_penalty_multiplier(0.03) == pytest.approx(0.875)  # strictly decreasing


def test_cluster_objectives():
    u = np.array([1.0, 0.5, 0.8])
    pi = np.array([1.0, 2.0, 1.0])
    assert cluster_objective("sum", u, pi) == pytest.approx(2.8)
    assert cluster_objective("fair", u, pi) == pytest.approx(-0.5)
    assert cluster_objective("fairsum", u, pi) == pytest.approx(2.8 - 3 * 0.5)
    assert cluster_objective("fairsum", u, pi, gamma=1.0) == pytest.approx(2.3)
    assert cluster_objective("penaltysum", u, pi) == pytest.approx(2.8)
    assert cluster_objective("penaltyfairsum", u, pi) == pytest.approx(1.3)
    with pytest.raises(ValueError):
        cluster_objective("max", u, pi)
