"""Faro's incremental reverse greedy takes exactly the steps of the plain one (issue 16)."""

import numpy as np
import pytest
from numba import njit

from agent.coordinator.faro import allocator
from agent.coordinator.faro.objectives import OBJECTIVES, objective_weights
from agent.coordinator.faro.problem import Capacity, JobSpec, Problem
from agent.coordinator.faro.tables import build_tables


# The reference: the ORIGINAL reverse greedy (before issue 16), verbatim apart from the
# names, scoring every model every step. Kept here as plain Python and compiled with njit.
def _ref_extremes(v, top, bot):
    size = top.shape[0]
    for k in range(size):
        top[k] = -1
        bot[k] = -1
    for i in range(v.shape[0]):
        for k in range(size):
            if top[k] < 0 or v[i] > v[top[k]]:
                for m in range(size - 1, k, -1):
                    top[m] = top[m - 1]
                top[k] = i
                break
        for k in range(size):
            if bot[k] < 0 or v[i] < v[bot[k]]:
                for m in range(size - 1, k, -1):
                    bot[m] = bot[m - 1]
                bot[k] = i
                break


def _ref_max_excl(v, top, a):
    for k in range(top.shape[0]):
        idx = top[k]
        if idx >= 0 and idx != a:
            return v[idx]
    return -np.inf


def _ref_min_excl(v, bot, a):
    for k in range(bot.shape[0]):
        idx = bot[k]
        if idx >= 0 and idx != a:
            return v[idx]
    return np.inf


def reference_reverse_greedy(x, values, offsets, length, prios, cpu, mem, cap_c, cap_m, A, G,
                             cost, extremes, max_excl, min_excl):
    n = x.shape[0]
    v = np.empty(n)
    for i in range(n):
        v[i] = values[offsets[i] + min(x[i], length[i]) - 1]
    tol_c = 1e-9 * max(1.0, cap_c)
    tol_m = 1e-9 * max(1.0, cap_m)
    used_c = np.dot(cpu, x.astype(np.float64))
    used_m = np.dot(mem, x.astype(np.float64))
    top = np.empty(4, np.int64)
    bot = np.empty(4, np.int64)
    while used_c > cap_c + tol_c or used_m > cap_m + tol_m:
        extremes(v, top, bot)
        over_c = used_c > cap_c + tol_c
        spread = v[top[0]] - v[bot[0]]
        bi = -1
        best = np.inf
        for i in range(n):
            if x[i] <= 1 or (over_c and cpu[i] <= 0.0) or (not over_c and mem[i] <= 0.0):
                continue
            nv = values[offsets[i] + x[i] - 2]
            maxo = max_excl(v, top, i)
            mino = min_excl(v, bot, i)
            loss = A * prios[i] * (v[i] - nv) + G * (max(maxo, nv) - min(mino, nv) - spread)
            r = loss / cost[i]
            if r < best:
                best = r
                bi = i
        if bi < 0:
            break
        x[bi] -= 1
        used_c -= cpu[bi]
        used_m -= mem[bi]
        v[bi] = values[offsets[bi] + x[bi] - 1]


_jit_ref = njit(reference_reverse_greedy)
_jit_helpers = (njit(_ref_extremes), njit(_ref_max_excl), njit(_ref_min_excl))
_py_helpers = (_ref_extremes, _ref_max_excl, _ref_min_excl)


def costs(cpu, mem, cap_c, cap_m):
    """The per-model cost ``fast_allocate`` hands the reverse greedy."""
    with np.errstate(divide="ignore", invalid="ignore"):
        cost = np.maximum(cpu / cap_c, np.where(cap_m > 0, mem / max(cap_m, 1e-300), 0.0))
    return np.maximum(cost, 1e-12)


def both(x, values, offsets, length, prios, cpu, mem, cap_c, cap_m, A, G, python=False):
    """``(reference x, new x)`` from the same start."""
    cost = costs(cpu, mem, cap_c, cap_m)
    args = (values, offsets, length, prios, cpu, mem, float(cap_c), float(cap_m), float(A),
            float(G), cost)
    want = x.copy()
    if python:
        reference_reverse_greedy(want, *args, *_py_helpers)
    else:
        _jit_ref(want, *args, *_jit_helpers)
    got = x.copy()
    allocator.reverse_greedy(got, *args)
    return want, got


def random_tables(rng, n, max_len, levels, monotone=True):
    """Flat value tables; few distinct ``levels`` make ties within and across models."""
    length = rng.integers(1, max_len + 1, n).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(length)[:-1]]).astype(np.int64)
    parts = []
    for m in length:
        steps = rng.integers(0, 3, m) / levels
        row = np.minimum(np.cumsum(steps), 1.0) if monotone else rng.integers(0, levels, m) / levels
        parts.append(row)
    return np.concatenate(parts), offsets, length


WEIGHTS = [(1.0, 0.0), (1.0, 7.0), (1.0, 1000.0), (1e-7, 1.0), (0.0, 1.0)]


@pytest.mark.parametrize("A,G", WEIGHTS)
def test_identical_on_random_monotone_tables(A, G):
    """Ties (few value levels, equal sizes), cpu- and memory-bound, zero-size resources."""
    rng = np.random.default_rng(int(G * 10 + A * 3))
    fast_paths = 0
    for trial in range(300):
        n = int(rng.integers(1, 30))
        values, offsets, length = random_tables(rng, n, 25, int(rng.choice([2, 4, 10, 1000])))
        prios = rng.choice([1.0, 1.0, 2.0, 0.5], n) if trial % 2 else np.ones(n)
        cpu = rng.choice([1.0, 1.0, 2.0, 0.5, 0.0], n) if trial % 3 else np.ones(n)
        mem = rng.choice([0.0, 1e9, 2e9, 4e9], n)
        x = length.copy() if trial % 4 else rng.integers(1, length + 1)
        used_c, used_m = float(cpu @ x), float(mem @ x)
        cap_c = float(rng.uniform(0.2, 1.0) * used_c)
        cap_m = float(rng.uniform(0.2, 1.2) * used_m) if trial % 5 else 1e30
        fast_paths += bool(allocator._drops_lower(x, values[offsets + x - 1], values, offsets))
        want, got = both(x, values, offsets, length, prios, cpu, mem, cap_c, cap_m, A, G)
        assert np.array_equal(want, got), (trial, want, got)
    assert fast_paths == 300  # monotone tables take the incremental path, not the scan


def test_identical_where_rounding_decides_ties():
    """Equal sizes and values in sevenths or tenths: scores equal on paper differ in the
    last bit depending on the largest value, so every change of it must rescore them."""
    rng = np.random.default_rng(7)
    for trial in range(1500):
        n = int(rng.integers(2, 8))
        values, offsets, length = random_tables(rng, n, 10, int(rng.choice([3, 7, 10, 100])))
        ones = np.ones(n)
        A, G = [(1.0, 1.0), (1.0, 3.0), (1.0, 7.0), (0.0, 1.0), (1.0, 1000.0)][trial % 5]
        cap_c = float(rng.integers(n, length.sum() + 1))
        want, got = both(length, values, offsets, length, ones, ones, np.zeros(n), cap_c, 0.0,
                         A, G)
        assert np.array_equal(want, got), (trial, want, got)


def test_identical_with_plain_python_reference():
    """The same check against the uncompiled reference (no compiler in common)."""
    rng = np.random.default_rng(5)
    for trial in range(40):
        n = int(rng.integers(1, 12))
        values, offsets, length = random_tables(rng, n, 12, int(rng.choice([2, 5, 1000])))
        prios = rng.choice([1.0, 2.0], n)
        cpu = rng.choice([1.0, 2.0], n)
        mem = rng.choice([0.0, 1e9], n)
        A, G = WEIGHTS[trial % len(WEIGHTS)]
        cap_c = 0.4 * float(cpu @ length)
        cap_m = 0.7 * float(mem @ length)
        want, got = both(length, values, offsets, length, prios, cpu, mem, cap_c, cap_m, A, G,
                         python=True)
        assert np.array_equal(want, got), (trial, want, got)


@pytest.mark.parametrize("A,G", WEIGHTS[:3])
def test_identical_on_tables_where_a_drop_raises_a_value(A, G):
    """Non-monotone tables (and a NaN) fall back to the plain scan: still identical."""
    rng = np.random.default_rng(11)
    for trial in range(100):
        n = int(rng.integers(1, 20))
        values, offsets, length = random_tables(rng, n, 15, 4, monotone=False)
        if trial % 10 == 0:
            values[rng.integers(0, len(values))] = np.nan
        prios = np.ones(n)
        cpu = rng.choice([1.0, 2.0], n)
        mem = np.zeros(n)
        cap_c = 0.3 * float(cpu @ length)
        want, got = both(length, values, offsets, length, prios, cpu, mem, cap_c, 0.0, A, G)
        assert np.array_equal(want, got), (trial, want, got)


def random_fleet(rng, objective, n):
    """A problem with ``n`` models whose tables ask far more CPU than there is."""
    models = []
    for i in range(n):
        p = float(rng.uniform(0.02, 0.3))
        models.append(JobSpec(
            f"m{i}", float(rng.uniform(0, 40.0 / p)), p, p * float(rng.uniform(0.8, 6)),
            float(rng.choice([90, 99, 99.9])), float(rng.choice([1, 1, 2, 0.5])),
            float(rng.choice([1, 1, 2])), float(rng.choice([0, 1e9, 2e9]))))
    cpu = float(sum(m.cpu_per_replica for m in models) * rng.uniform(2, 6))
    mem = float(sum(m.memory_per_replica_bytes for m in models) * rng.uniform(2, 8) + 1e9)
    estimator = str(rng.choice(["mdc", "upper"]))
    return Problem(Capacity(cpu, mem), tuple(models), objective=objective, estimator=estimator)


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_identical_on_faro_tables(objective):
    """Real value tables of random fleets, from every replica count the tables allow."""
    rng = np.random.default_rng(len(objective))
    for _ in range(6):
        problem = random_fleet(rng, objective, int(rng.integers(2, 120)))
        tables = build_tables(problem)
        prios = np.array([m.priority for m in problem.models])
        cpu = np.array([m.cpu_per_replica for m in problem.models])
        mem = np.array([m.memory_per_replica_bytes for m in problem.models])
        A, G = objective_weights(objective, len(prios), prios, problem.gamma)
        want, got = both(tables.length.copy(), tables.values, tables.offsets, tables.length,
                         prios, cpu, mem, problem.capacity.cpu, problem.capacity.memory_bytes,
                         A, G)
        assert np.array_equal(want, got)
        assert float(cpu @ got) <= problem.capacity.cpu + 1e-6
