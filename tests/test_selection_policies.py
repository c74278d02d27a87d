"""Selection policies (agent.node.selection.policies) on the synthetic classifier's
answers: they learn the best member, move off it when it fails and come back when it
heals (the departures from the paper), while the controls do not come back."""

import math
import random

import numpy as np
import pytest

from agent.backends.synthetic import classify
from agent.config import parse_model_config
from agent.node.selection.policies import LearnedState, SelectionPolicy, loss_of

#: Five members: the best fails on queries [FAIL, HEAL), the others are stationary.
N, FAIL, HEAL = 6000, 1500, 3000
ERRORS = (0.1, 0.2, 0.25, 0.3, 0.35)


def _answers(seed):
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, 10, N)
    x = np.stack([np.arange(N), truth, np.zeros(N)], 1).astype(np.float32)
    preds = []
    for m, err in enumerate(ERRORS):
        spec = {"classes": 10, "seed": seed, "error": err,
                "schedule": [[FAIL, HEAL, 0.9]] if m == 0 else []}
        c = parse_model_config({"backend": "synthetic",
                                "synthetic": {"classifier": spec}}).synthetic.classifier
        preds.append(classify(c, f"m{m}", x))
    return np.stack(preds), truth


def _run(policy, seed=1):
    """(cumulative error, every static member's error, per query the leading member)."""
    preds, truth = _answers(seed)
    state, rng = policy.fresh(), random.Random(seed)
    wrong, lead = np.zeros(N), np.zeros(N, int)
    for q in range(N):
        asked, probs = policy.select(state, [True] * 5, rng)
        answer, _ = policy.combine(state, {i: preds[i, q:q + 1].reshape(1, 1) for i in asked},
                                   "label")
        wrong[q] = answer[0, 0] != truth[q]
        policy.observe(state, {i: float(preds[i, q] != truth[q]) for i in asked}, 1,
                       dict(zip(asked, probs)))
        lead[q] = int(np.argmax(state.weights))
    return wrong.mean(), (preds != truth).mean(axis=1), lead


def _moved_off_and_back(lead):
    off = np.flatnonzero(lead[FAIL:] != 0)
    back = np.flatnonzero(lead[HEAL:] == 0)
    return (off[0] if len(off) else None), (back[0] if len(back) else None)


@pytest.mark.parametrize("name", ["exp4", "exp3", "thompson"])
def test_policy_recovers_and_beats_every_static_member(name):
    error, static, lead = _run(SelectionPolicy(name, 5))
    assert (error < static).all(), (error, static)
    off, back = _moved_off_and_back(lead)
    assert off is not None and off < 1000
    assert back is not None and back < 2500
    assert (lead[:FAIL][500:] == 0).mean() > 0.8  # it had learned the best member


@pytest.mark.parametrize("name, options", [("exp4", {"share": 0}),
                                           ("thompson", {"discount": 1})])
def test_controls_without_forgetting_do_not_come_back(name, options):
    _, _, lead = _run(SelectionPolicy(name, 5, **options))
    off, back = _moved_off_and_back(lead)
    assert off is not None  # they do move off ...
    assert back is None     # ... but never return within the rest of the stream


def test_clippers_literal_exp4_collapses_onto_one_member_and_sticks():
    """Clipper's removed Exp4 update (divide by p, no floor): the members trusted less
    are punished more until their weights underflow to exactly 0, which is never updated
    again; the app is left with the best member alone and keeps it through its failure."""
    error, static, lead = _run(SelectionPolicy("clipper_exp4", 5))
    state = SelectionPolicy("clipper_exp4", 5).fresh()
    assert state.weights == [1.0] * 5  # Clipper's raw weights
    off, _ = _moved_off_and_back(lead)
    assert off is None              # it never leaves the failed member ...
    assert error > static.min()     # ... so a static member beats it


def test_clippers_literal_exp4_update_step():
    p = SelectionPolicy("clipper_exp4", 2)
    state = p.fresh()
    p.observe(state, {0: 1.0, 1: 0.0}, 1, {})
    assert state.weights == [pytest.approx(math.exp(-0.01 / 0.5)), 1.0]
    state.weights = [0.0, 1.0]
    p.observe(state, {0: 0.0, 1: 1.0}, 1, {})
    assert state.weights[0] == 0.0  # a weight at 0 stays there


def test_epsilon_greedy_with_a_discount_comes_back():
    _, _, lead = _run(SelectionPolicy("epsilon_greedy", 5, epsilon=0.2))
    off, back = _moved_off_and_back(lead)
    assert off is not None and off < 1000 and back is not None


def test_exp4_combines_by_weighted_vote_over_those_that_answered():
    p = SelectionPolicy("exp4", 3)
    state = LearnedState.fresh(3, [0.5, 0.3, 0.2])
    a = {0: np.array([[1], [1]]), 1: np.array([[2], [3]]), 2: np.array([[2], [3]])}
    answer, agree = p.combine(state, a, "label")
    assert answer.tolist() == [[1], [1]] and agree.tolist() == [1, 1]
    del a[0]  # the heavy member missed the deadline: renormalised over the others
    answer, agree = p.combine(state, a, "label")
    assert answer.tolist() == [[2], [3]] and agree.tolist() == [2, 2]
    scores = {0: np.array([[0.9, 0.1]], np.float32), 1: np.array([[0.1, 0.9]], np.float32)}
    mean, agree = p.combine(LearnedState.fresh(2, [0.75, 0.25]), scores, "scores")
    assert mean.dtype == np.float32 and np.allclose(mean, [[0.7, 0.3]])
    assert agree.tolist() == [1]


def test_exp3_weights_the_update_by_the_probability_stored_with_the_prediction():
    p = SelectionPolicy("exp3", 2, share=0, gamma=0)
    a, b = p.fresh(), p.fresh()
    p.observe(a, {0: 1.0}, 1, {0: 0.5})
    p.observe(b, {0: 1.0}, 1, {0: 0.05})  # picked rarely: the same loss weighs more
    assert b.weights[0] < a.weights[0] < 0.5


def test_static_never_learns_and_splits_by_its_weights():
    p = SelectionPolicy("static", 2, static_weights=(0.9, 0.1))
    state, rng = p.fresh(), random.Random(3)
    picks = [p.select(state, [True, True], rng)[0][0] for _ in range(2000)]
    assert 0.86 < picks.count(0) / 2000 < 0.94
    p.observe(state, {0: 1.0}, 5, {0: 0.9})
    assert state.weights == pytest.approx([0.9, 0.1])


def test_single_pick_policies_prefer_resident_members():
    p = SelectionPolicy("exp3", 3)
    state, rng = p.fresh(), random.Random(1)
    picks = {p.select(state, [False, True, False], rng)[0][0] for _ in range(100)}
    assert picks == {1}


def test_state_remap_starts_new_members_at_the_mean_weight():
    s = LearnedState([0.6, 0.2, 0.2], [1, 2, 3], [0, 0, 0], [5, 6, 7])
    r = s.remap(["a", "b", "c"], ["c", "a", "new"])
    mean = (0.2 + 0.6) / 2
    total = 0.2 + 0.6 + mean
    assert r.weights == pytest.approx([0.2 / total, 0.6 / total, mean / total])
    assert r.observed == [7, 5, 0] and LearnedState.from_json(r.as_json()) == r


def test_losses_per_kind():
    labels = np.array([1, 2])
    assert loss_of("label", np.array([[1], [3]]), labels).tolist() == [0, 1]
    assert loss_of("scores", np.array([[0, 1.0, 0], [1.0, 0, 0]]), labels).tolist() == [0, 1]
    assert loss_of("value", np.array([[1.5], [9.0]]), labels).tolist() == [0.5, 1.0]
