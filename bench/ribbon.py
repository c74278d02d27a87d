"""Ribbon fleet-sizing benchmark: Bayesian optimisation vs pruned random search.

For each of the five measured grids in ``shared/data/ribbon`` (and a few synthetic grids
the search has never seen), over ``--seeds`` seeds: how often the optimum (the cheapest
configuration with QoS >= 99 %, by exhaustive search) is found within 100 samples, and
the median and mean number of samples up to and including the one that found it
(``samples_to_best``, the initial samples counted), for ``bo`` and ``random``. Beside
them, Ribbon's published mean samples to the optimum (SC'21 Fig. 10; the artifact counts
from after its two initial samples) and the optimum's saving vs the homogeneous pool of
``homogeneous.json`` (the first type alone).

A seed that does not find the optimum within the budget counts as infinite for the
median; the mean is over the seeds that found it. Random search gets no budget (it runs
to the optimum) so that its median is defined.

    .venv/bin/python bench/ribbon.py [--seeds 20] [--data ../shared/data/ribbon]
        [--synthetic 6] [--unseen 10] [--unseen-from 300] [--no-shared]

``--unseen N`` adds N more synthetic grids (seeds 300, 301, ..., or from
``--unseen-from``, with 3, 4, 5, 3, ... types) kept apart from the ones above for
validation. Seeds 300-309 were not used to choose the search's design (it was chosen on
the shared grids and on grids 500-520); 400-409 were run once, at the end, as a fresh
check.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

from agent.coordinator.ribbon.evaluators import LookupGridEvaluator
from agent.coordinator.ribbon.search import search
from agent.coordinator.ribbon.synthetic import make_grid

GRIDS = ("candle", "resnet", "vgg", "mtwnd", "dien")
PUBLISHED_MEAN = {"candle": 33, "resnet": 39, "vgg": 47, "mtwnd": 17, "dien": 23}
BUDGET = 100
DEFAULT_DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "ribbon"


def optimum_price(evaluator: LookupGridEvaluator) -> float:
    exhaustive = search(evaluator, "exhaustive")
    assert exhaustive.best is not None, "no configuration meets QoS"
    return exhaustive.best.price


def runs(evaluator, method: str, seeds: int, opt: float, budget: int | None,
         prune: bool = True) -> list[float]:
    """samples_to_best per seed (inf when the optimum was not found within budget)."""
    out = []
    for seed in range(seeds):
        r = search(evaluator, method, seed=seed, prune=prune,
                   max_samples=budget if budget else evaluator.space.size,
                   until=lambda res: res.best is not None and res.best.price <= opt + 1e-9)
        hit = r.best is not None and abs(r.best.price - opt) < 1e-9
        out.append(float(r.samples_to_best) if hit else math.inf)
    return out


def summary(xs: list[float]) -> tuple[int, float, float]:
    found = [x for x in xs if x <= BUDGET]
    mean = statistics.mean([x for x in xs if math.isfinite(x)]) if any(
        math.isfinite(x) for x in xs) else math.inf
    return len(found), statistics.median(xs), mean


def row(name: str, ev, opt: float, seeds: int, published: str, saving: str) -> str:
    bo = runs(ev, "bo", seeds, opt, BUDGET)
    rnd = runs(ev, "random", seeds, opt, None, prune=False)
    pruned = runs(ev, "random", seeds, opt, None)
    bf, bmed, bmean = summary(bo)
    rf, rmed, rmean = summary(rnd)
    pf, pmed, _ = summary(pruned)
    ok = bf >= math.ceil(0.9 * len(bo)) and (published == "-" or bmed <= float(published)) \
        and bmed <= rmed / 2
    return (f"{name:<11} {ev.space.size:>5}  {bf:>3}/{len(bo):<3} {bmed:>6.1f} {bmean:>6.1f}"
            f"   {rf:>3}/{len(rnd):<3} {rmed:>6.1f} {rmean:>6.1f}   {pf:>3}/{len(pruned):<3}"
            f" {pmed:>6.1f}  {published:>9}  {saving:>7}  {'yes' if ok else 'NO'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--synthetic", type=int, default=6,
                    help="number of synthetic grids (seeds 100, 101, ...)")
    ap.add_argument("--unseen", type=int, default=0,
                    help="number of validation grids (seeds 300, 301, ...; 3-5 types)")
    ap.add_argument("--unseen-from", type=int, default=300,
                    help="seed of the first validation grid (default 300; 400 for a "
                         "fresh set)")
    ap.add_argument("--no-shared", action="store_true",
                    help="skip the five measured grids")
    args = ap.parse_args()
    homogeneous = json.loads((args.data / "homogeneous.json").read_text())
    print(f"{args.seeds} seeds; found = optimum within {BUDGET} samples; samples to the "
          f"optimum, 1-based, initial samples included")
    print(f"{'':<18} {'---- bo (Ribbon) ----':<22}  {'--- random, plain ---':<22}"
          f"  {'random, pruned':<14}")
    print(f"{'grid':<11} {'size':>5}  {'found':>7} {'median':>6} {'mean':>6}   "
          f"{'found':>7} {'median':>6} {'mean':>6}   {'found':>7} {'median':>6}  "
          f"{'published':>9}  {'saving':>7}  done")
    t0 = time.perf_counter()
    for name in () if args.no_shared else GRIDS:
        ev = LookupGridEvaluator.from_files(args.data / f"config-{name}.json",
                                            args.data / f"lookup-{name}.json")
        opt = optimum_price(ev)
        homo = (homogeneous[name],) + (0,) * (len(ev.space.types) - 1)
        homo_price = ev.price(homo)
        saving = f"{100 * (1 - opt / homo_price):.1f}%"
        print(row(name, ev, opt, args.seeds, str(PUBLISHED_MEAN[name]), saving),
              flush=True)
    for k in range(args.synthetic):
        config, lookup = make_grid(100 + k)
        ev = LookupGridEvaluator.from_dicts(config, lookup)
        opt = optimum_price(ev)
        name = f"syn{100 + k}/{len(ev.space.types)}t"
        print(row(name, ev, opt, args.seeds, "-", "-"), flush=True)
    for k in range(args.unseen):
        grid_seed = args.unseen_from + k
        config, lookup = make_grid(grid_seed, 3 + k % 3)
        ev = LookupGridEvaluator.from_dicts(config, lookup)
        opt = optimum_price(ev)
        print(row(f"val{grid_seed}/{len(ev.space.types)}t", ev, opt, args.seeds, "-", "-"),
              flush=True)
    print(f"({time.perf_counter() - t0:.0f} s; done = bo found in >= 90 % of seeds, median "
          f"<= published mean, median <= half of plain random's)")


if __name__ == "__main__":
    main()
