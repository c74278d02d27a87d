"""Selection policies (Clipper §5, Listing 2): select → combine → observe, pure.

A policy holds only its parameters; what it learns is a ``LearnedState`` of plain lists (one per
app and per context), so states can be copied, persisted as JSON and kept per user. No
I/O, no clock, no node import: randomness comes in as a ``random.Random``.

Departures from the paper, on purpose: ``exp4`` updates every member from its own loss
(full information, Hedge), not Clipper's divide-by-p; ``exp3`` and ``exp4`` mix a share
of the mean weight back after each update (fixed share, Herbster & Warmuth) so a member
that failed and healed regains weight; ``epsilon_greedy`` and ``thompson`` discount old
observations so that they too come back. ``clipper_exp4`` (Clipper's removed Exp4 code,
line for line), ``share: 0`` (plain Hedge) and ``discount: 1`` (Seldon's Thompson) are
kept as controls.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

#: Policies that ask every member and combine (the others ask one member); the names
#: are ``agent.config.modelconfig.SELECTION_POLICIES``.
ENSEMBLES = ("exp4", "clipper_exp4")
#: Clipper's ``Exp4Policy::eta`` (``selection_policies.hpp``): the control's learning rate.
CLIPPER_ETA = 0.01
#: Members whose values lie this close (relative) to the combined value agree with it.
VALUE_AGREEMENT = 0.05


@dataclass
class LearnedState:
    """What a policy learned for one app or context: ``weights`` (selection weights,
    summing to 1), ``wins``/``losses`` (discounted counts: the bandits'), ``observed``
    (observations applied per member)."""

    weights: list[float]
    wins: list[float]
    losses: list[float]
    observed: list[int] = field(default_factory=list)

    @classmethod
    def fresh(cls, members: int, weights: Sequence[float] | None = None) -> LearnedState:
        w = list(weights) if weights else [1.0] * members
        total = sum(w) or 1.0
        return cls([x / total for x in w], [0.0] * members, [0.0] * members,
                   [0] * members)

    def copy(self) -> LearnedState:
        return LearnedState(list(self.weights), list(self.wins), list(self.losses),
                     list(self.observed))

    def as_json(self) -> dict[str, Any]:
        return {"weights": self.weights, "wins": self.wins, "losses": self.losses,
                "observed": self.observed}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> LearnedState:
        return cls([float(x) for x in doc["weights"]], [float(x) for x in doc["wins"]],
                   [float(x) for x in doc["losses"]], [int(x) for x in doc["observed"]])

    def remap(self, old: Sequence[str], new: Sequence[str]) -> LearnedState:
        """This state over members ``new`` (it was learned over ``old``): members kept
        keep their figures, new ones start at the mean weight and no counts."""
        where = {m: i for i, m in enumerate(old)}
        kept = [where[m] for m in new if m in where]
        mean_w = sum(self.weights[i] for i in kept) / len(kept) if kept else 1.0

        def pick(values: list, i: int | None, default: Any) -> Any:
            return values[i] if i is not None else default

        out = LearnedState([], [], [], [])
        for m in new:
            i = where.get(m)
            out.weights.append(pick(self.weights, i, mean_w))
            out.wins.append(pick(self.wins, i, 0.0))
            out.losses.append(pick(self.losses, i, 0.0))
            out.observed.append(pick(self.observed, i, 0))
        total = sum(out.weights) or 1.0
        out.weights = [w / total for w in out.weights]
        return out


@dataclass(frozen=True)
class SelectionPolicy:
    """One of ``POLICIES`` with its parameters (``selection:`` in the app's config)."""

    name: str
    members: int
    eta: float = 0.1             # exp3/exp4 learning rate
    share: float | None = None   # exp3/exp4 fixed share (0: plain Hedge / Exp3)
    gamma: float = 0.05          # exp3 uniform exploration
    epsilon: float = 0.1         # epsilon_greedy exploration
    discount: float | None = None  # epsilon_greedy/thompson (1: undiscounted)
    static_weights: tuple[float, ...] = ()

    @property
    def ensemble(self) -> bool:
        return self.name in ENSEMBLES

    @property
    def mix(self) -> float:
        """The fixed share: smaller for exp3, whose importance-weighted updates are
        noisier (a larger share keeps losing members picked too often)."""
        if self.share is not None:
            return self.share
        return 0.001 if self.name == "exp3" else 0.01

    @property
    def decay(self) -> float:
        """The discount per observation: epsilon_greedy discounts only the arm observed
        (exploration revisits the others), so it forgets faster than thompson's, which
        discounts every arm at every observation."""
        if self.discount is not None:
            return self.discount
        return 0.98 if self.name == "epsilon_greedy" else 0.995

    def fresh(self) -> LearnedState:
        if self.name == "clipper_exp4":  # Clipper's raw weights: 1.0 each, never normalised
            k = self.members
            return LearnedState([1.0] * k, [0.0] * k, [0.0] * k, [0] * k)
        return LearnedState.fresh(self.members, self.static_weights or None)

    # -- select -------------------------------------------------------------------------
    def probabilities(self, state: LearnedState) -> list[float]:
        """Each member's chance to be picked (ensembles: its weight in the combination)."""
        k = self.members
        if self.name == "exp3":
            return [(1 - self.gamma) * w + self.gamma / k for w in state.weights]
        if self.name == "epsilon_greedy":
            best = max(range(k), key=lambda i: self._mean(state, i))
            return [self.epsilon / k + (1 - self.epsilon) * (i == best) for i in range(k)]
        if self.name == "thompson":  # the posterior means, for people and load decisions
            means = [(1 + state.wins[i]) / (2 + state.wins[i] + state.losses[i])
                     for i in range(k)]
            total = sum(means)
            return [m / total for m in means]
        if self.name == "clipper_exp4":  # raw weights over their sum (0 once all underflow)
            total = sum(state.weights)
            return [w / total if total > 0 else 0.0 for w in state.weights]
        return list(state.weights)

    def _mean(self, state: LearnedState, i: int) -> float:
        n = state.wins[i] + state.losses[i]
        return state.wins[i] / n if n > 0 else 0.5

    def select(self, state: LearnedState, available: Sequence[bool], rng: random.Random
               ) -> tuple[list[int], list[float]]:
        """(members to ask, the probability each was picked with). Ensembles ask every
        member; the others pick one, among the ``available`` (resident) ones when any
        is, with the probabilities renormalised over them."""
        k = self.members
        if self.ensemble:
            return list(range(k)), [1.0] * k
        pool = [i for i in range(k) if available[i]] or list(range(k))
        if self.name == "thompson":
            draws = {i: rng.betavariate(1 + state.wins[i], 1 + state.losses[i]) for i in pool}
            pick = max(pool, key=draws.__getitem__)
            return [pick], [1.0]
        p = self.probabilities(state)
        total = sum(p[i] for i in pool)
        x, acc, pick = rng.random() * total, 0.0, pool[-1]
        for i in pool:
            acc += p[i]
            if x < acc:
                pick = i
                break
        return [pick], [p[pick] / total if total > 0 else 1.0 / len(pool)]

    # -- combine ------------------------------------------------------------------------
    def combine(self, state: LearnedState, answers: dict[int, np.ndarray], kind: str
                ) -> tuple[np.ndarray, np.ndarray]:
        """(the answer, per row the number of members that agree with it) from the
        members that answered (``answers``: member → its output), weights renormalised
        over them."""
        members = sorted(answers)
        w = np.array([state.weights[i] if self.ensemble else 1.0 for i in members])
        w = w / w.sum() if w.sum() > 0 else np.full(len(members), 1.0 / len(members))
        outs = [answers[i] for i in members]
        if kind == "label":
            labels = np.stack([o.reshape(len(o), -1)[:, 0] for o in outs])  # [M, N]
            values = np.unique(labels)  # sorted: a tie goes to the smallest label
            tally = np.tensordot(w, labels[None, :, :] == values[:, None, None],
                                 axes=([0], [1]))  # [V, N]: each label's weight per row
            choice = values[tally.argmax(axis=0)]
            agree = (labels == choice).sum(axis=0)
            return choice.astype(outs[0].dtype).reshape(outs[0].shape[:1] + (1,) * (
                outs[0].ndim - 1)), agree
        stacked = np.stack([o.astype(np.float64) for o in outs])
        mean = np.tensordot(w, stacked, axes=1)
        if kind == "scores":
            flat = stacked.reshape(len(outs), len(outs[0]), -1)
            agree = (flat.argmax(axis=2) == mean.reshape(len(outs[0]), -1).argmax(axis=1)
                     ).sum(axis=0)
        else:
            flat = stacked.reshape(len(outs), len(outs[0]), -1)
            target = mean.reshape(len(outs[0]), -1)
            close = np.abs(flat - target) <= VALUE_AGREEMENT * np.abs(target) + 1e-9
            agree = close.all(axis=2).sum(axis=0)
        return mean.astype(outs[0].dtype), agree

    # -- observe ------------------------------------------------------------------------
    def observe(self, state: LearnedState, losses: dict[int, float], rows: int,
                probabilities: dict[int, float]) -> None:
        """Learn from feedback: ``losses`` member → its mean loss in [0, 1] over ``rows``
        rows; ``probabilities``: member → the probability it was picked with (stored with
        the prediction)."""
        if self.name == "static" or not losses:
            return
        for i in losses:
            state.observed[i] += rows
        if self.name == "clipper_exp4":
            self._clipper_exp4(state, losses, rows)
        elif self.name in ("exp3", "exp4"):
            self._exponential(state, losses, rows, probabilities)
        elif self.name == "epsilon_greedy":
            for i, loss in losses.items():
                d = self.decay ** rows
                state.wins[i] = d * state.wins[i] + rows * (1 - loss)
                state.losses[i] = d * state.losses[i] + rows * loss
            self._weights_from_means(state)
        else:  # thompson: every arm forgets, so an arm not asked for long is tried again
            d = self.decay ** rows
            state.wins = [d * x for x in state.wins]
            state.losses = [d * x for x in state.losses]
            for i, loss in losses.items():
                state.wins[i] += rows * (1 - loss)
                state.losses[i] += rows * loss
            self._weights_from_means(state)

    def _exponential(self, state: LearnedState, losses: dict[int, float], rows: int,
                     probabilities: dict[int, float]) -> None:
        logw = [math.log(max(w, 1e-300)) for w in state.weights]
        p = self.probabilities(state)
        if self.name == "exp3":
            rows = 1  # one pick, one round of the bandit, whatever the request's rows
        for i, loss in losses.items():
            if self.name == "exp3":  # importance-weighted by its stored probability
                logw[i] -= self.eta * loss / max(probabilities.get(i, p[i]), 1e-6)
            else:
                logw[i] -= self.eta * rows * loss
        top = max(logw)
        w = [math.exp(x - top) for x in logw]
        total = sum(w)
        w = [x / total for x in w]
        if self.mix > 0:
            keep = (1 - self.mix) ** rows
            w = [keep * x + (1 - keep) / self.members for x in w]
        state.weights = w

    def _clipper_exp4(self, state: LearnedState, losses: dict[int, float], rows: int) -> None:
        """Clipper's ``Exp4Policy::process_feedback`` as it was before its removal
        (ucbrise/clipper ``ee929186``, ``src/libclipper/src/selection_policies.cpp``;
        unchanged since ``bac5ec8b``, removed by ``11f57328``): raw float weights, each
        member in turn multiplied by exp(-eta * loss / (s_i / weight_sum)) with the running
        sum, a weight at 0 never updated again; no floor, no mixing, no normalisation.
        Clipper took one feedback per query: a request of ``rows`` rows is ``rows`` such
        rounds of the members' mean loss."""
        s = state.weights
        total = sum(s)
        for _ in range(rows):
            for i in sorted(losses):
                if s[i] != 0 and total > 0:
                    new = s[i] * math.exp(-CLIPPER_ETA * losses[i] / (s[i] / total))
                    total += new - s[i]
                    s[i] = new

    def _weights_from_means(self, state: LearnedState) -> None:
        means = [self._mean(state, i) for i in range(self.members)]
        total = sum(means) or 1.0
        state.weights = [m / total for m in means]


def loss_of(kind: str, answer: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Per row loss in [0, 1] of a member's ``answer`` against ``labels``: 0/1 for labels
    and scores (the arg max), the absolute error capped at 1 for values."""
    rows = len(labels)
    if kind == "label":
        return (answer.reshape(rows, -1)[:, 0] != labels).astype(np.float64)
    if kind == "scores":
        return (answer.reshape(rows, -1).argmax(axis=1) != labels).astype(np.float64)
    return np.minimum(np.abs(answer.reshape(rows, -1)[:, 0] - labels), 1.0)
