"""Replica counts → nodes: memory-aware, stable, respecting pins and node capacity.

A replica of model m on node n needs ``cpu_per_replica`` cores there, and the node
must hold the model resident: ``resident_bytes`` once per node that runs the model,
plus ``memory_per_replica_bytes`` per replica (working memory; 0 by default).
``pinned_nodes`` (when not empty) are the only nodes the model may run on;
``preferred_nodes`` are where a new replica goes first among nodes that do not run the
model yet (they hold its files: no download).

``place`` starts from the current placement: replicas that still fit their pins and the
nodes' capacities stay where they are (a model over its target loses replicas from the
node where it has most; an over-full node sheds replicas of the models with most
replicas there). Missing replicas go first to nodes already holding the model (no new
load), then to preferred nodes, then to the node with the most free memory that fits
(spreading), models with the largest resident size first. Replicas that fit nowhere are reported in ``unplaced``,
never dropped silently. When the current placement already matches the targets and
fits, nothing moves.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import NamedTuple

_TOL = 1e-9


class Machine(NamedTuple):
    """A machine's capacity for replicas (a tuple: a fleet makes 100,000 per plan)."""

    name: str
    cpu: float
    memory_bytes: float


@dataclass(frozen=True)
class ModelDemand:
    """How many replicas a model should run and what each needs."""

    name: str
    replicas: int
    cpu_per_replica: float = 1.0
    resident_bytes: float = 0.0
    memory_per_replica_bytes: float = 0.0
    pinned_nodes: frozenset[str] = field(default_factory=frozenset)
    preferred_nodes: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True)
class Placement:
    """``assignment[node][model]`` = replicas; moves = replicas started + stopped."""

    assignment: dict[str, dict[str, int]]
    started: int
    stopped: int
    unplaced: dict[str, int]

    @property
    def moves(self) -> int:
        return self.started + self.stopped


def _usage(node_plan: dict[str, int], models: dict[str, ModelDemand]) -> tuple[float, float]:
    cpu = mem = 0.0
    for name, count in node_plan.items():
        if count > 0:
            m = models[name]
            cpu += count * m.cpu_per_replica
            mem += m.resident_bytes + count * m.memory_per_replica_bytes
    return cpu, mem


def _fits(node: Machine, node_plan: dict[str, int], models: dict[str, ModelDemand]) -> bool:
    cpu, mem = _usage(node_plan, models)
    return cpu <= node.cpu + _TOL and mem <= node.memory_bytes + _TOL


def _allowed(m: ModelDemand, node: str) -> bool:
    return not m.pinned_nodes or node in m.pinned_nodes


def place(nodes: list[Machine], demands: list[ModelDemand],
          current: dict[str, dict[str, int]] | None = None) -> Placement:
    """Assign every model's target replicas to nodes, moving as little as possible.
    Each node's usage is kept as replicas move, and a model's candidate nodes are
    weighed once into a heap: adding a replica changes only its node's entry, so a
    model's missing replicas cost a pop and a push each, not a scan of its nodes
    (``bench/plan_scale.py``)."""
    models = {m.name: m for m in demands}
    if len(models) != len(demands):
        raise ValueError("model names must be unique")
    by_name = {n.name: n for n in nodes}
    current = current or {}
    plan: dict[str, dict[str, int]] = {n.name: {} for n in nodes}
    # 1. keep what may stay (known node, known model, pin allowed)
    total: dict[str, int] = {}  # model -> its replicas in the plan, kept as they move
    for node_name, row in current.items():
        if node_name not in by_name:
            continue
        kept = plan[node_name]
        for model_name, count in row.items():
            m = models.get(model_name)
            if m is not None and count > 0 \
                    and (not m.pinned_nodes or node_name in m.pinned_nodes):  # _allowed
                kept[model_name] = int(count)
                total[model_name] = total.get(model_name, 0) + kept[model_name]
    # 2. trim models above target, from the node where they have the most replicas
    # (ties: the last name)
    over = {m.name for m in demands if total.get(m.name, 0) > m.replicas}
    holders: dict[str, list[str]] = {}  # model over its target -> the nodes it is on
    if over:
        for node_name, row in plan.items():
            for model_name in over.intersection(row):
                holders.setdefault(model_name, []).append(node_name)
    for m in demands:
        excess = total.get(m.name, 0) - m.replicas
        if excess <= 0:
            continue
        total[m.name] = m.replicas
        on = sorted(holders[m.name])
        heap = [(-plan[n][m.name], -rank, n) for rank, n in enumerate(on)]
        heapq.heapify(heap)
        while excess > 0:
            count, rank, node = heapq.heappop(heap)
            plan[node][m.name] -= 1
            excess -= 1
            heapq.heappush(heap, (count + 1, rank, node))
    # 3. relieve over-full nodes (capacity shrank or current was infeasible)
    usage = {}  # node -> (cpu, memory) its row uses
    for node in nodes:
        row = plan[node.name]
        cpu, mem = _usage(row, models)
        while cpu > node.cpu + _TOL or mem > node.memory_bytes + _TOL:  # not _fits
            victim = max((k for k, v in row.items() if v > 0), key=lambda k: (row[k], k))
            row[victim] -= 1
            total[victim] -= 1
            cpu, mem = _usage(row, models)
        usage[node.name] = (cpu, mem)
    # 4. add missing replicas
    unplaced: dict[str, int] = {}
    order = sorted(demands, key=lambda m: (-m.resident_bytes, -m.replicas, m.name))
    rank = {n.name: i for i, n in enumerate(sorted(nodes, key=lambda n: n.name))}
    for m in order:
        missing = m.replicas - total.get(m.name, 0)
        if missing <= 0:
            continue
        candidates = [by_name[n] for n in m.pinned_nodes if n in by_name] \
            if m.pinned_nodes else nodes  # only where it may go (a fleet is large)
        heap = [e for e in (_entry(n, plan, usage, m, rank) for n in candidates)
                if e is not None]
        heapq.heapify(heap)
        while missing > 0:
            if not heap:
                unplaced[m.name] = missing
                break
            node = heapq.heappop(heap)[-1]  # the best node: only its usage changes here
            plan[node.name][m.name] = plan[node.name].get(m.name, 0) + 1
            usage[node.name] = _usage(plan[node.name], models)
            missing -= 1
            entry = _entry(node, plan, usage, m, rank)
            if entry is not None:
                heapq.heappush(heap, entry)
    assignment = {n: {k: v for k, v in row.items() if v > 0} for n, row in plan.items()}
    started = stopped = 0
    for node_name in set(assignment) | set(current):
        new_row = assignment.get(node_name, {})
        old_row = current.get(node_name, {})
        if new_row == old_row:
            continue
        for model_name in set(new_row) | set(old_row):
            delta = new_row.get(model_name, 0) - old_row.get(model_name, 0)
            started += max(delta, 0)
            stopped += max(-delta, 0)
    return Placement(assignment, started, stopped, unplaced)


def _entry(node: Machine, plan: dict[str, dict[str, int]],
           usage: dict[str, tuple[float, float]], m: ModelDemand,
           rank: dict[str, int]) -> tuple | None:
    """``node``'s heap entry for one more replica of ``m`` (None: it does not fit
    there). The smallest entry is the node that replica goes to: one that already holds
    ``m`` first, then one of its ``preferred_nodes``, then the most free memory, then
    the most free cores, then the last name (``rank``: each node's place by name)."""
    cpu, mem = usage[node.name]
    holds = plan[node.name].get(m.name, 0) > 0
    more = m.memory_per_replica_bytes + (0.0 if holds else m.resident_bytes)
    if cpu + m.cpu_per_replica > node.cpu + _TOL \
            or mem + more > node.memory_bytes + _TOL:
        return None
    return (not holds, node.name not in m.preferred_nodes, mem - node.memory_bytes,
            cpu - node.cpu, -rank[node.name], node)
