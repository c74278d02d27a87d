"""Placement of replica counts onto nodes: capacity, pins, stability."""

from agent.coordinator.faro.placement import ModelDemand, Machine, place

NODES = [Machine("n1", 8, 16e9), Machine("n2", 8, 16e9), Machine("n3", 4, 8e9)]


def check_feasible(placement, nodes, demands):
    models = {m.name: m for m in demands}
    for node in nodes:
        row = placement.assignment[node.name]
        cpu = sum(c * models[k].cpu_per_replica for k, c in row.items())
        mem = sum(models[k].resident_bytes + c * models[k].memory_per_replica_bytes
                  for k, c in row.items())
        assert cpu <= node.cpu and mem <= node.memory_bytes
        for k in row:
            assert not models[k].pinned_nodes or node.name in models[k].pinned_nodes


def placed(placement, name):
    return sum(row.get(name, 0) for row in placement.assignment.values())


def demands():
    return [ModelDemand("a", 6, 1, 5e9), ModelDemand("b", 5, 1, 6e9, 1e8, frozenset({"n2", "n3"})),
            ModelDemand("c", 7, 1, 2e9)]


def test_respects_capacity_and_pins():
    p = place(NODES, demands())
    check_feasible(p, NODES, demands())
    assert p.unplaced == {}
    assert all(placed(p, m.name) == m.replicas for m in demands())


def test_feasible_current_placement_moves_nothing():
    first = place(NODES, demands())
    again = place(NODES, demands(), first.assignment)
    assert again.moves == 0 and again.assignment == first.assignment


def test_growth_only_starts_new_replicas():
    first = place(NODES, demands())
    grown = [ModelDemand("a", 8, 1, 5e9)] + demands()[1:]
    p = place(NODES, grown, first.assignment)
    check_feasible(p, NODES, grown)
    assert p.stopped == 0 and p.started == 2
    before = {n for n, row in first.assignment.items() if "a" in row}
    after = {n for n, row in p.assignment.items() if "a" in row}
    assert before <= after


def test_overfull_and_impossible_are_reported():
    small = [Machine("n1", 2, 16e9)]
    current = {"n1": {"a": 5}}
    p = place(small, [ModelDemand("a", 5, 1, 1e9)], current)
    check_feasible(p, small, [ModelDemand("a", 5, 1, 1e9)])
    assert p.assignment == {"n1": {"a": 2}} and p.unplaced == {"a": 3} and p.stopped == 3
    pinned = [ModelDemand("z", 1, 1, 1e9, pinned_nodes=frozenset({"nowhere"}))]
    assert place(NODES, pinned).unplaced == {"z": 1}


def test_memory_limits_residency():
    nodes = [Machine("n1", 16, 10e9), Machine("n2", 16, 10e9)]
    big = [ModelDemand("x", 2, 1, 6e9), ModelDemand("y", 2, 1, 6e9)]
    p = place(nodes, big)
    check_feasible(p, nodes, big)
    assert p.unplaced == {}
    assert all(len(row) == 1 for row in p.assignment.values())


def _reference_place(nodes, demands, current=None):
    """The straightforward placement (usage summed again per candidate) that ``place``
    keeps incrementally: both must agree."""
    from agent.coordinator.faro.placement import Placement, _allowed, _fits, _usage
    models = {m.name: m for m in demands}
    by_name = {n.name: n for n in nodes}
    current = current or {}
    plan = {n.name: {} for n in nodes}
    for node_name, row in current.items():
        if node_name in by_name:
            for model_name, count in row.items():
                m = models.get(model_name)
                if m is not None and count > 0 and _allowed(m, node_name):
                    plan[node_name][model_name] = int(count)
    holders = {}
    for node_name, row in plan.items():
        for model_name in row:
            holders.setdefault(model_name, set()).add(node_name)
    for m in demands:
        on = holders.get(m.name, set())
        while sum(plan[n].get(m.name, 0) for n in on) > m.replicas:
            node = max(on, key=lambda n: (plan[n].get(m.name, 0), n))
            plan[node][m.name] -= 1
    for node in nodes:
        row = plan[node.name]
        while not _fits(node, row, models):
            victim = max((k for k, v in row.items() if v > 0), key=lambda k: (row[k], k))
            row[victim] -= 1
    unplaced = {}
    for m in sorted(demands, key=lambda m: (-m.resident_bytes, -m.replicas, m.name)):
        missing = m.replicas - sum(plan[n].get(m.name, 0) for n in holders.get(m.name, ()))
        while missing > 0:
            best, best_key = None, None
            for node in nodes:
                if not _allowed(m, node.name):
                    continue
                trial = dict(plan[node.name])
                trial[m.name] = trial.get(m.name, 0) + 1
                if not _fits(node, trial, models):
                    continue
                cpu, mem = _usage(plan[node.name], models)
                key = (plan[node.name].get(m.name, 0) > 0, node.name in m.preferred_nodes,
                       node.memory_bytes - mem, node.cpu - cpu, node.name)
                if best_key is None or key > best_key:
                    best, best_key = node.name, key
            if best is None:
                unplaced[m.name] = missing
                break
            plan[best][m.name] = plan[best].get(m.name, 0) + 1
            missing -= 1
    assignment = {n: {k: v for k, v in row.items() if v > 0} for n, row in plan.items()}
    return Placement(assignment, 0, 0, unplaced)


def test_incremental_usage_places_as_the_straightforward_version():
    import random
    rng = random.Random(7)
    for trial in range(300):
        nodes = [Machine(f"n{i}", rng.choice([1, 2, 4, 8]), rng.choice([1, 2, 4, 8]) * 1e9)
                 for i in range(rng.randint(1, 12))]
        names = [n.name for n in nodes]
        demands = [ModelDemand(
            f"m{j}", rng.randint(0, 12), rng.choice([0.5, 1, 2]),
            rng.choice([0, 1e8, 5e8, 2e9]), rng.choice([0, 1e8]),
            frozenset(rng.sample(names, rng.randint(1, len(names))))
            if rng.random() < 0.5 else frozenset(),
            frozenset(rng.sample(names, rng.randint(0, len(names)))))
            for j in range(rng.randint(1, 8))]
        current = {rng.choice(names + ["gone"]): {f"m{rng.randint(0, 9)}": rng.randint(0, 5)
                                                  for _ in range(3)} for _ in range(5)}
        for start in (None, current):
            got, want = place(nodes, demands, start), _reference_place(nodes, demands, start)
            assert (got.assignment, got.unplaced) == (want.assignment, want.unplaced), trial
