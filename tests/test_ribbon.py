"""Ribbon fleet sizing: search, pruning, evaluators, ``edgeagent plan size``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from agent.cli import main
from agent.coordinator.ribbon import search as search_module
from agent.coordinator.ribbon.evaluators import (LookupGridEvaluator, SizingError,
                                                 parse_counts)
from agent.coordinator.choices import SIZE_METHODS
from agent.coordinator.ribbon.search import search
from agent.coordinator.ribbon.space import SearchSpace, objective
from agent.coordinator.ribbon.synthetic import make_grid, optimum

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "ribbon"
OPTIMA = {"candle": ((6, 0, 2), 4.36), "resnet": ((4, 0, 5), 4.13),
          "vgg": ((6, 0, 4), 5.03), "mtwnd": ((4, 0, 1), 2.25), "dien": ((5, 1, 0), 2.78)}
needs_data = pytest.mark.skipif(not (DATA / "lookup-dien.json").is_file(),
                                reason="shared/data/ribbon not present")


def grid(name: str) -> LookupGridEvaluator:
    return LookupGridEvaluator.from_files(DATA / f"config-{name}.json",
                                          DATA / f"lookup-{name}.json")


def toy(qos: dict, maxima=(3, 3), prices=(1.0, 0.7)) -> LookupGridEvaluator:
    """A small grid: every configuration's QoS from ``qos`` (default 0)."""
    space = SearchSpace(("a", "b"), tuple(maxima))
    table = {tuple(int(c) for c in row): (float(np.dot(row, prices)), qos.get(tuple(row), 0.0))
             for row in space.grid().tolist()}
    return LookupGridEvaluator(space, table)


def test_objective_is_eq2():
    assert objective(49.5, 3.0, 10.0, 99.0) == pytest.approx(0.25)
    assert objective(99.0, 3.0, 10.0, 99.0) == pytest.approx(0.85)
    assert objective(98.99, 0.0, 10.0, 99.0) < 0.5 <= objective(100.0, 10.0, 10.0, 99.0)


def test_space_grid_and_size():
    space = SearchSpace(("x", "y", "z"), (2, 0, 3))
    g = space.grid()
    assert len(g) == space.size == 3 * 1 * 4 - 1
    assert tuple(g[0]) == (0, 0, 1) and not any(np.all(g == 0, axis=1))
    with pytest.raises(ValueError):
        SearchSpace(("x",), (0,))


@pytest.mark.parametrize("method", SIZE_METHODS)
def test_same_seed_same_samples(method):
    config, lookup = make_grid(7)
    ev = LookupGridEvaluator.from_dicts(config, lookup)
    a = search(ev, method, seed=3, max_samples=25).to_json()
    b = search(ev, method, seed=3, max_samples=25).to_json()
    assert a == b and a["samples"] == 25
    if method != "exhaustive":
        assert search(ev, method, seed=4, max_samples=25).to_json()["history"] != a["history"]


def test_json_fields_and_samples_to_best():
    ev = grid_or_synthetic()
    out = search(ev, "bo", seed=0, max_samples=30).to_json()
    assert set(out) == {"best", "price", "qos_percent", "samples", "samples_to_best",
                        "history"}
    assert out["samples"] == len(out["history"])
    if out["best"] is not None:
        first = out["history"][out["samples_to_best"] - 1]
        assert first["counts"] == out["best"] and first["price"] == out["price"]
        assert all(h["price"] >= out["price"] or h["qos_percent"] < 99
                   for h in out["history"])


def grid_or_synthetic() -> LookupGridEvaluator:
    if (DATA / "lookup-dien.json").is_file():
        return grid("dien")
    return LookupGridEvaluator.from_dicts(*make_grid(3))


def test_pruning_below_a_miss_respects_the_threshold():
    # (2, 2) misses by 0.5 points: within the 1-point threshold, nothing below is pruned;
    # (3, 3) misses by 5 points: everything at or below it is pruned.
    ev = toy({(2, 2): 98.5, (3, 3): 94.0, (1, 1): 99.5})
    state = search_module._State(ev, "bo", 1.0)
    index = {tuple(r): i for i, r in enumerate(state.grid.tolist())}
    state.evaluate(index[(2, 2)])
    assert state.alive.sum() == ev.space.size - 1
    state.evaluate(index[(3, 3)])
    assert not state.alive.any()
    # No threshold (0): the same near miss prunes below it, (1, 1) with it.
    state = search_module._State(ev, "bo", 0.0)
    state.evaluate(index[(2, 2)])
    assert not state.alive[index[(1, 1)]]


def test_pruning_above_the_best_feasible_price():
    ev = toy({(1, 1): 99.5, (0, 3): 99.9, (2, 0): 99.0})
    state = search_module._State(ev, "bo", 1.0)
    index = {tuple(r): i for i, r in enumerate(state.grid.tolist())}
    state.evaluate(index[(1, 1)])          # $1.70
    alive = {tuple(state.grid[i]) for i in np.flatnonzero(state.alive)}
    assert alive and all(ev.price(c) <= 1.7 + 1e-9 for c in alive)
    assert (0, 2) in alive and (2, 0) not in alive


@needs_data
def test_threshold_keeps_the_optimum_where_plain_pruning_loses_it():
    # resnet, vgg and dien have near misses (98.x %) that dominate the optimum.
    for name in ("resnet", "vgg", "dien"):
        ev = grid(name)
        best, _ = OPTIMA[name]
        near = [k for k, (_, q) in ev.table.items()
                if q < 99 and all(a >= b for a, b in zip(k, best))]
        assert near and all(ev.table[k][1] >= 98 for k in near), name


def test_unmeasured_configurations_are_skipped_not_counted():
    config = {"ins_types": ["a", "b"], "max_num": [2, 2]}
    lookup = {"1, 0": [1.0, 50.0], "2, 0": [2.0, 99.5], "0, 1": [0.5, 40.0],
              "1, 1": [1.5, 99.2], "0, 2": [1.0, 70.0]}     # (2,1), (1,2), (2,2) missing
    ev = LookupGridEvaluator.from_dicts(config, lookup)
    assert ev.measure((2, 2)) is None and ev.price((2, 2)) == pytest.approx(3.0)
    for method in SIZE_METHODS:
        r = search(ev, method, seed=1, max_samples=100)
        assert r.samples <= len(lookup) and r.best.counts == (1, 1), method
        assert all(s.counts in {parse_counts(k, 2) for k in lookup} for s in r.history)
    assert search(ev, "exhaustive").unmeasured == 3


def test_bad_files_are_clear_errors(tmp_path):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"ins_types": ["a", "b"], "max_num": [2, 2]}))
    for bad in ({"1, 0, 0": [1, 50]}, {"1, 0": [1]}, {"1, 0": [1, 150]}, {"3, 0": [1, 50]},
                []):
        lookup = tmp_path / "l.json"
        lookup.write_text(json.dumps(bad))
        with pytest.raises(SizingError):
            LookupGridEvaluator.from_files(config, lookup)
    with pytest.raises(SizingError):
        LookupGridEvaluator.from_files(tmp_path / "missing.json", config)


@needs_data
@pytest.mark.parametrize("name", sorted(OPTIMA))
def test_finds_the_optimum_on_the_shared_grids(name):
    ev = grid(name)
    best, price = OPTIMA[name]
    found = 0
    for seed in range(3):
        r = search(ev, "bo", seed=seed, max_samples=100,
                   until=lambda res: res.best is not None and res.best.price <= price)
        found += r.best is not None and r.best.counts == best
    assert found >= 2, name


@needs_data
def test_exhaustive_agrees_with_the_published_optima():
    for name, (best, price) in OPTIMA.items():
        r = search(grid(name), "exhaustive")
        assert (r.best.counts, r.best.price) == (best, price), name
        assert r.samples == grid(name).space.size - r.unmeasured


@pytest.mark.parametrize("grid_seed", [101, 104])
def test_unseen_synthetic_grid(grid_seed):
    # Other prices, shapes and type counts than the shared grids.
    config, lookup = make_grid(grid_seed)
    ev = LookupGridEvaluator.from_dicts(config, lookup)
    _, price = optimum(lookup)
    assert search(ev, "exhaustive").best.price == price
    found = 0
    for seed in range(3):
        r = search(ev, "bo", seed=seed, max_samples=100,
                   until=lambda res: res.best is not None and res.best.price <= price)
        found += r.best is not None and r.best.price == price
    assert found >= 2


def test_five_type_grid_found_in_every_seed():
    # 5 instance types, 7,349 pools (bench/ribbon.py's val302): Ribbon's single GP on
    # Eq. 2 found its optimum in 6 of 10 seeds within 100 samples (issue 12).
    config, lookup = make_grid(302, 5)
    ev = LookupGridEvaluator.from_dicts(config, lookup)
    _, price = optimum(lookup)
    for seed in range(3):
        r = search(ev, "bo", seed=seed, max_samples=100,
                   until=lambda res: res.best is not None and res.best.price <= price)
        assert r.best is not None and r.best.price == price, seed


def test_bo_with_a_100_percent_target():
    space = SearchSpace(("a", "b"), (4, 4), target_percent=100.0)
    table = {tuple(int(c) for c in r): (float(r[0] + 0.6 * r[1]),
                                         100.0 if r[0] + r[1] >= 5 else 20.0 * (r[0] + r[1]))
             for r in space.grid().tolist()}
    r = search(LookupGridEvaluator(space, table), "bo", seed=0, max_samples=24)
    assert r.best is not None and r.best.qos_percent == 100.0
    assert r.best.price == min(p for p, q in table.values() if q >= 100.0)


def test_cli_json_and_table(tmp_path):
    config, lookup = make_grid(3)
    c, lk = tmp_path / "c.json", tmp_path / "l.json"
    c.write_text(json.dumps(config))
    lk.write_text(json.dumps(lookup))
    args = ["plan", "size", "--config", str(c), "--lookup", str(lk), "--seed", "2",
            "--max-samples", "20"]
    r = CliRunner().invoke(main, [*args, "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert list(out) == ["best", "price", "qos_percent", "samples", "samples_to_best",
                         "history"]
    assert out["samples"] == 20 and len(out["history"]) == 20
    assert set(out["history"][0]) == {"counts", "price", "qos_percent"}
    assert out == search(LookupGridEvaluator.from_dicts(config, lookup), "bo", seed=2,
                         max_samples=20).to_json()
    text = CliRunner().invoke(main, args)
    assert text.exit_code == 0 and "configurations evaluated" in text.output
    assert text.output.count("best ") >= 20      # a progress line per sample
    bad = CliRunner().invoke(main, ["plan", "size", "--config", str(c), "--lookup",
                                    str(tmp_path / "none.json")])
    assert bad.exit_code != 0 and "cannot read" in bad.output
