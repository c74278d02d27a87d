"""Directives: what the coordinator tells one node, valid for ``ttl_s`` seconds.

The answer to every report (JSON)::

    {"node": "edge-1", "plan_id": 7, "ttl_s": 60,
     "workers": {"resnet": 2}, "pin": ["resnet"], "prefetch": ["resnet"],
     "drop_rate": {"bert": 0.05}}

``workers``: replicas of the plan on this node (the model's worker count). ``pin``: keep
these resident (the plan runs replicas here). ``prefetch``: of those, the ones not
resident yet: load them now. ``drop_rate``: the share of requests to shed (penalty
objectives only; absent means 0). A node reverts what it applied when directives are
not renewed within ``ttl_s`` (coordinator gone): a missing coordinator never leaves
models pinned forever. Both sides keep directives in a ``DirectiveBook``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Directives:
    node: str
    ttl_s: float
    plan_id: int | None = None
    workers: dict[str, int] = field(default_factory=dict)
    pin: tuple[str, ...] = ()
    prefetch: tuple[str, ...] = ()
    drop_rate: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "plan_id": self.plan_id, "ttl_s": self.ttl_s,
                "workers": dict(self.workers), "pin": list(self.pin),
                "prefetch": list(self.prefetch), "drop_rate": dict(self.drop_rate)}

    @classmethod
    def from_json(cls, data: Any) -> "Directives":
        """Parse a coordinator's answer; ValueError names what is malformed."""
        if not isinstance(data, dict):
            raise ValueError("directives must be a JSON object")
        ttl = data.get("ttl_s")
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0 \
                or not math.isfinite(ttl):
            raise ValueError(f"ttl_s must be a number > 0, got {ttl!r}")
        workers = data.get("workers") or {}
        if not isinstance(workers, dict) or not all(
                isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
                and v >= 0 for k, v in workers.items()):
            raise ValueError("workers must map model names to integers >= 0")
        lists = {}
        for key in ("pin", "prefetch"):
            value = data.get(key) or []
            if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
                raise ValueError(f"{key} must be a list of model names")
            lists[key] = tuple(value)
        drops = data.get("drop_rate") or {}
        if not isinstance(drops, dict) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1
                for v in drops.values()):
            raise ValueError("drop_rate must map model names to numbers in [0, 1]")
        plan_id = data.get("plan_id")
        return cls(node=str(data.get("node", "")), ttl_s=float(ttl),
                   plan_id=plan_id if isinstance(plan_id, int) else None,
                   workers=dict(workers), drop_rate={k: float(v) for k, v in drops.items()},
                   **lists)


def directives_for(plan: dict[str, Any] | None, node: str, resident: set[str],
                   ttl_s: float, plan_id: int | None = None) -> Directives:
    """The directives ``plan`` implies for ``node`` (empty without a plan).
    ``resident``: the models the node reported resident (no need to prefetch them)."""
    if not plan:
        return Directives(node=node, ttl_s=ttl_s, plan_id=plan_id)
    row = {m: int(n) for m, n in (plan.get("assignment") or {}).get(node, {}).items() if n > 0}
    models = plan.get("models") or {}
    drops = {m: float(models[m].get("drop_rate") or 0.0) for m in row if m in models}
    pin = tuple(sorted(row))
    return Directives(node=node, ttl_s=ttl_s, plan_id=plan_id, workers=row, pin=pin,
                      prefetch=tuple(m for m in pin if m not in resident),
                      drop_rate={m: r for m, r in drops.items() if r > 0})


class DirectiveBook:
    """The directives last issued to (or received by) each node, and when they lapse.
    Times come from the caller's clock."""

    def __init__(self) -> None:
        self._issued: dict[str, tuple[Directives, float]] = {}

    def issue(self, directives: Directives, now: float) -> None:
        self._issued[directives.node] = (directives, now + directives.ttl_s)

    def current(self, node: str, now: float) -> Directives | None:
        """The node's directives, or None when there are none or they expired."""
        entry = self._issued.get(node)
        return entry[0] if entry is not None and now < entry[1] else None

    def expires_at(self, node: str) -> float | None:
        entry = self._issued.get(node)
        return entry[1] if entry is not None else None

    def expire(self, node: str) -> Directives | None:
        """Drop ``node``'s directives; the ones dropped."""
        entry = self._issued.pop(node, None)
        return entry[0] if entry is not None else None
