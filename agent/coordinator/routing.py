"""The routing table: which live nodes run each model under the current plan, with
their replicas as weights, and where those nodes are reached (``agent.wire.RoutingTable``).
Routing nodes get it in the answer to their report and forward a request for a model
to one of its nodes (``agent.node.routing``).

* Made from the plan's per-node rows (``plan.directive_rows``: each node's replicas per
  model and the address it reported, ``NodeReport.peer``, made in the planning process
  from the store, so coordinators sharing a store agree), a newer address where the
  node reported one here since: a planned node this coordinator knows to be silent
  past ``node_timeout_s``, or that reports no address (it does not route), is left
  out, so a dead node leaves the table within ``node_timeout_s`` and its models are
  served where requests land until a plan places them elsewhere.
* Its version is a digest of its content: the same plan and addresses make the same
  version on every coordinator sharing a store, so a node whose report lands on
  another one is not sent the table again.
* Small on the wire: a node whose report names the current version gets the version
  alone (``splice``); the table's JSON is made once per change, not per answer.
* During a rollout that sets a ``traffic_share`` (``versions.VersionTable.splits``) a
  model's entry names every reachable node of the rollout, and its weights give those
  on the new version that share of the model's requests, the others the rest, each
  side split by the plan's replicas (1 where the plan runs none): ``weigh``. With every
  node on one side (the last wave), the weights are the replicas again.
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterable

import orjson

from agent.coordinator.store import StoredPlan

#: JSON bytes of an answer to a node that routes while there is no table.
_NO_TABLE = b',"routing_version":null}'
#: The weight a rollout's share of 1 would get (the weights are whole numbers).
SHARE_SCALE = 1000
#: model -> (its rollout's nodes, those on the new version, their share of the requests)
Splits = dict[str, tuple[frozenset[str], frozenset[str], float]]


def weigh(replicas: dict[str, int], new: frozenset[str], share: float) -> dict[str, int]:
    """Weights that give the nodes of ``new`` ``share`` of a model's requests and the
    others the rest, each side in proportion to ``replicas``; ``replicas`` as they are
    when one side has no node."""
    sides = ({n: r for n, r in replicas.items() if n in new},
             {n: r for n, r in replicas.items() if n not in new})
    if not all(sides):
        return dict(replicas)
    out = {}
    for side, part in zip(sides, (share, 1.0 - share)):
        total = sum(side.values())
        for node, r in side.items():
            out[node] = max(1, round(SHARE_SCALE * part * r / total))
    return out


def table_version(content: dict[str, Any]) -> int:
    """A version for a table's ``content``: a digest of its JSON (sorted keys), under
    2**48 so that every JSON reader keeps it exact."""
    digest = hashlib.blake2b(orjson.dumps(content, option=orjson.OPT_SORT_KEYS),
                             digest_size=6).digest()
    return int.from_bytes(digest, "big")


def build_table(workers: Iterable[tuple[str, dict[str, int]]],
                addresses: dict[str, tuple[str, str | None]], max_age_s: float,
                splits: Splits | None = None) -> tuple[int, bytes]:
    """(version, the table's JSON) from each planned node's replicas per model
    (``workers``), the reachable nodes' addresses (a node without one is left out) and
    the rollouts' ``splits`` (``weigh``)."""
    models: dict[str, dict[str, int]] = {}
    nodes: dict[str, dict[str, str | None]] = {}
    for node, row in workers:
        peer = addresses.get(node)
        if peer is None:
            continue
        for model, replicas in row.items():
            if replicas > 0:
                models.setdefault(model, {})[node] = int(replicas)
                nodes[node] = {"url": peer[0], "grpc": peer[1]}
    for model, (fleet, new, share) in sorted((splits or {}).items()):
        planned = models.get(model, {})
        reached = {n: planned.get(n, 1) for n in sorted(fleet) if n in addresses}
        if reached:
            models[model] = weigh(reached, new, share)
            nodes.update({n: {"url": addresses[n][0], "grpc": addresses[n][1]}
                          for n in reached})
    content = {"max_age_s": max_age_s, "nodes": nodes, "models": models}
    version = table_version(content)
    return version, orjson.dumps({"version": version, **content},
                                 option=orjson.OPT_SORT_KEYS)


class RoutingBook:
    """The current routing table (version and JSON) of one coordinator process; the
    coordinator rebuilds it (``update``), its report workers take it as pushed
    (``adopt``), and both answer reports with it (``splice``)."""

    def __init__(self) -> None:
        self.version: int | None = None
        self.table: bytes | None = None
        self._key: tuple | None = None
        self._plan_id: int | None = None
        self._workers: dict[str, dict[str, int]] = {}  # the plan's rows, parsed once
        self._planned_at: dict[str, tuple[str, str | None]] = {}  # the plan's addresses

    def update(self, plan: StoredPlan | None, addresses: dict[str, tuple[str, str | None]],
               max_age_s: float, silent: frozenset[str] = frozenset(),
               splits: Splits | None = None) -> bool:
        """Make the table of ``plan`` over its nodes but the ``silent`` ones (known to
        this coordinator and not heard from within ``node_timeout_s``), each reached at
        the address the plan kept for it or a newer one in ``addresses`` (the live
        nodes that reported here: with several coordinators on one store, the plan's
        keep every coordinator's table alike) and weighed by the rollouts' ``splits``
        (a table of those alone without a plan), unless nothing it depends on changed;
        whether it changed."""
        if plan is None and not splits:
            changed = self.version is not None
            self.version, self.table, self._key, self._plan_id = None, None, None, None
            return changed
        if plan is None:
            self._plan_id, self._workers, self._planned_at = None, {}, {}
        elif plan.id != self._plan_id:
            self._plan_id = plan.id
            parsed = {node: orjson.loads(row) for node, row in plan.rows.items()}
            self._workers = {node: row[0] for node, row in parsed.items()}
            self._planned_at = {node: tuple(row[4]) for node, row in parsed.items()
                                if len(row) > 4 and row[4]}
        split_nodes = {n for fleet, _, _ in (splits or {}).values() for n in fleet}
        reach = {n: addresses.get(n) or self._planned_at.get(n)
                 for n in set(self._workers) | split_nodes if n not in silent}
        reach = {n: a for n, a in reach.items() if a is not None}
        key = (self._plan_id, max_age_s, tuple(sorted(reach.items())),
               tuple(sorted((splits or {}).items(), key=lambda kv: kv[0])))
        if key == self._key:
            return False
        self._key = key
        version, table = build_table(self._workers.items(), reach, max_age_s, splits)
        changed = version != self.version
        self.version, self.table = version, table
        return changed

    def adopt(self, version: int | None, table: bytes | None) -> None:
        """Serve the table another process made (a report worker's)."""
        self.version, self.table = version, table

    def planned_nodes(self) -> set[str]:
        """The nodes the plan behind the table runs models on (alive or not)."""
        return set(self._workers)

    def splice(self, body: bytes, routes: bool, held: int | None) -> bytes:
        """``body`` (directives' JSON) with the table's version for a node that
        ``routes``, and the table itself where the node holds another version
        (``held``: the one its report or lease named); as it is for a node that does
        not route."""
        if not routes:
            return body
        if self.version is None or self.table is None:
            return body[:-1] + _NO_TABLE
        if held == self.version:
            return body[:-1] + b',"routing_version":%d}' % self.version
        return body[:-1] + b',"routing_version":%d,"routing":%s}' % (self.version,
                                                                    self.table)
