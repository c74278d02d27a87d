"""Placement of replica counts onto nodes: capacity, pins, stability."""

from agent.coordinator.faro.placement import ModelDemand, Node, place

NODES = [Node("n1", 8, 16e9), Node("n2", 8, 16e9), Node("n3", 4, 8e9)]


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
    small = [Node("n1", 2, 16e9)]
    current = {"n1": {"a": 5}}
    p = place(small, [ModelDemand("a", 5, 1, 1e9)], current)
    check_feasible(p, small, [ModelDemand("a", 5, 1, 1e9)])
    assert p.assignment == {"n1": {"a": 2}} and p.unplaced == {"a": 3} and p.stopped == 3
    pinned = [ModelDemand("z", 1, 1, 1e9, pinned_nodes=frozenset({"nowhere"}))]
    assert place(NODES, pinned).unplaced == {"z": 1}


def test_memory_limits_residency():
    nodes = [Node("n1", 16, 10e9), Node("n2", 16, 10e9)]
    big = [ModelDemand("x", 2, 1, 6e9), ModelDemand("y", 2, 1, 6e9)]
    p = place(nodes, big)
    check_feasible(p, nodes, big)
    assert p.unplaced == {}
    assert all(len(row) == 1 for row in p.assignment.values())
