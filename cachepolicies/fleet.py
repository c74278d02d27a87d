"""A fleet of nodes, each its own cache, replayed (``edgeagent simulate --nodes``).

One trace spread over the nodes as a load balancer would (round robin: request ``i``
lands on node ``i mod N``), then routed as the nodes' routers route it with nothing
outstanding (``agent.node.routing``): a model the routing table gives nodes goes to one
of them by smooth weighted round robin over their replicas, one rotation per landing
node and model (each node keeps its own); a model it does not name is served where it
landed. Each node's share of the trace is then replayed through its own cache
(``simulator.simulate``, the twin with ``queueing``), and the fleet's result is the sum.

Several nodes' own records (their traces and profiles, ``--from`` repeated) are a fleet
already spread: each is replayed through its own cache, the same way.

``replay_nodes`` replays each node's share through the twin with that node's own
profiles and the coordinator's directives as the node applied them (its pins and
prefetches, ``twin.Directive``): the pins shrink the room the rest of the traffic
shares, the prefetches are loads no request asked for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import fields, replace
from typing import Any

import numpy as np

from cachepolicies import twin
from cachepolicies.registry import make_policy
from cachepolicies.simulator import SimulationResult
from cachepolicies.traces import Profiles, Trace, check_capacity


def routing_weights(doc: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """model -> node -> replicas from a routing table (the wire's ``RoutingTable``, or
    ``GET /v1/routing``'s form with ``planned`` per model) or a plan's ``assignment``
    (``GET /v1/plan``); ValueError naming what is malformed."""
    if "assignment" in doc:
        out: dict[str, dict[str, int]] = {}
        for node, row in (doc.get("assignment") or {}).items():
            for model, replicas in row.items():
                out.setdefault(model, {})[node] = replicas
        models = out
    else:
        models = doc.get("models")
        if not isinstance(models, Mapping):
            raise ValueError("a routing table has 'models' (model -> node -> replicas) "
                             "or a plan's 'assignment'")
        models = {m: (w.get("planned", {}) if isinstance(w, Mapping) and "planned" in w
                      else w) for m, w in models.items()}
    for model, weights in models.items():
        if not isinstance(weights, Mapping) or any(
                not isinstance(r, int) or isinstance(r, bool) or r < 0
                for r in weights.values()):
            raise ValueError(f"routing of model {model!r}: expected node -> replicas "
                             f"(whole numbers), got {weights!r}")
    return {m: {n: int(r) for n, r in w.items() if r > 0} for m, w in models.items()}


def fleet_nodes(count: int, weights: Mapping[str, Mapping[str, int]]) -> list[str]:
    """``count`` node names: those the routing names (sorted), then ``node-<i>``."""
    named = sorted({n for w in weights.values() for n in w})
    if len(named) > count:
        raise ValueError(f"the routing names {len(named)} nodes ({', '.join(named)}); "
                         f"--nodes is {count}")
    return named + [f"node-{i}" for i in range(len(named), count)]


def spread(trace: Trace, profiles: Profiles, nodes: Sequence[str],
           weights: Mapping[str, Mapping[str, int]]) -> dict[str, Trace]:
    """Each node's share of ``trace``: landed round robin, routed by ``weights``."""
    names = profiles.names
    serving = np.empty(len(trace), dtype=np.int64)
    index = {n: i for i, n in enumerate(nodes)}
    current: dict[tuple[int, int], dict[str, int]] = {}  # (landed, model) -> SWRR
    for i, model_id in enumerate(trace.model_ids):
        landed = i % len(nodes)
        planned = weights.get(names[model_id])
        if not planned:
            serving[i] = landed
            continue
        state = current.setdefault((landed, int(model_id)), dict.fromkeys(planned, 0))
        total = sum(planned.values())
        for node, weight in planned.items():
            state[node] += weight
        best = min(planned, key=lambda n: (-state[n], n))  # as ``PeerBook.choose``
        state[best] -= total
        serving[i] = index[best]
    return {node: Trace(trace.timestamps[serving == k], trace.model_ids[serving == k],
                        f"{trace.source} on {node}") for k, node in enumerate(nodes)}


_SUMMED = ("requests", "hits", "misses", "load_delay_seconds", "evictions", "bytes_loaded",
           "load_wait_seconds", "failed", "slo_violations", "downloads",
           "bytes_downloaded", "download_delay_seconds", "disk_evictions")


def fleet_total(results: Sequence[SimulationResult]) -> SimulationResult:
    """The fleet's result from its nodes' (same policy and capacity per node): counts
    summed, the capacity the fleet's, means weighted by requests, tails the worst."""
    first = results[0]
    values: dict[str, Any] = {}
    for f in fields(SimulationResult):
        column = [getattr(r, f.name) for r in results]
        if f.name in _SUMMED:
            values[f.name] = None if column[0] is None else sum(column)
    requests = values["requests"]
    values["capacity_bytes"] = sum(r.capacity_bytes for r in results)
    values["mean_load_delay_seconds"] = values["load_delay_seconds"] / requests \
        if requests else 0.0
    if first.mean_response_seconds is not None:
        served = [(r.requests - (r.failed or 0), r.mean_response_seconds or 0.0)
                  for r in results]
        count = sum(n for n, _ in served)
        values["mean_response_seconds"] = sum(n * m for n, m in served) / count \
            if count else 0.0
        values["p95_response_seconds"] = max(r.p95_response_seconds or 0.0 for r in results)
        values["p99_response_seconds"] = max(r.p99_response_seconds or 0.0 for r in results)
    return replace(first, **values)


def replay_nodes(traces: Mapping[str, Trace], profiles: Mapping[str, Profiles],
                 capacity: int, policy_spec: str,
                 settings: twin.Queueing | Mapping[str, twin.Queueing], *,
                 directives: Mapping[str, Sequence[twin.Directive]] | None = None,
                 log_events: bool = False) -> dict[str, twin.Outcome]:
    """Each node's share (``traces``) through its own twin: ``capacity`` bytes under the
    policy ``policy_spec`` names, on the node's ``profiles`` (the same model ids in
    every one) and ``settings`` (one for all, or the node's own), with the node's
    ``directives`` (none: no plan)."""
    out = {}
    for node, trace in traces.items():
        check_capacity(trace, profiles[node], capacity)
        policy = make_policy(policy_spec, future=trace.model_ids)
        mine = settings if isinstance(settings, twin.Queueing) else settings[node]
        out[node] = twin.replay(trace, profiles[node], capacity, policy, mine,
                                directives=(directives or {}).get(node, ()),
                                log_events=log_events)
    return out
