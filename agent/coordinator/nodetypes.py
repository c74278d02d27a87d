"""The instance catalogue: kinds of node the fleet can be made of, with their prices.

Held in the coordinator's config (``node_types``) and, for one sizing request, in the
body of ``POST /v1/sizing``; agents name their kind in their config
(``coordinator.node_type``), sent with every report (``agent.wire``)::

    node_types:
      c5.large:   {price_per_hour: 0.085, max_count: 10, launch_s: 120}
      c5.2xlarge: {price_per_hour: 0.34, max_count: 4, launch_s: 150,
                   cores: 8, cpu_memory_bytes: 16GiB, proc_ms: {resnet: 21.5}}

``price_per_hour`` is required; ``max_count`` (default 8) bounds the sizing search;
``launch_s`` (default 0) is the time a new node takes to serve, its price paid while it
starts (MArk's launch overhead). ``cores``, ``cpu_memory_bytes`` and ``proc_ms`` (per
model processing ms on this kind) default to what the nodes of this kind report;
``capacity_rps`` (requests per second one node serves) to their measured throughput.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agent.validation import SchemaError, check, json_object, number, only, size
from agent.wire import MAX_BYTES, MAX_CORES, MAX_MS, NAME

DEFAULT_MAX_COUNT = 8
MAX_COUNT = 1000

FIELDS = ("price_per_hour", "max_count", "launch_s", "cores", "cpu_memory_bytes",
          "proc_ms", "capacity_rps")
_CHECKS = {
    "price_per_hour": number(0, 1e6, finite=True),
    "max_count": number(0, MAX_COUNT, integer=True),
    "launch_s": number(0, 86400, finite=True),
    "cores": number(0, MAX_CORES, strict_lo=True, finite=True),
    "cpu_memory_bytes": size,
    "capacity_rps": number(0, 1e9, strict_lo=True, finite=True),
}
_PROC_MS = number(0, MAX_MS, strict_lo=True, finite=True)


@dataclass(frozen=True)
class NodeType:
    """One kind of node; None fields come from the reports of nodes of this kind."""

    name: str
    price_per_hour: float
    max_count: int = DEFAULT_MAX_COUNT
    launch_s: float = 0.0
    cores: float | None = None
    cpu_memory_bytes: float | None = None
    proc_ms: dict[str, float] = field(default_factory=dict)
    capacity_rps: float | None = None



def parse_node_types(data: Any, prefix: str = "node_types",
                     base: dict[str, NodeType] | None = None) -> dict[str, NodeType]:
    """``{name: NodeType}`` from a mapping; ``SchemaError`` names the bad key
    (``node_types.c5.large.price_per_hour``). An entry of ``base`` with the same name
    (the config's, under a request's) supplies the fields an entry leaves out."""
    d = check(json_object, data, prefix)
    base = base or {}
    out = {}
    for name, entry in d.items():
        if not isinstance(name, str) or not NAME.match(name):
            raise SchemaError(prefix, f"bad node type name {name!r} (1-128 letters, "
                              "digits, '_', '.' or '-')")
        where = f"{prefix}.{name}"
        e = check(json_object, entry, where)
        only(e, FIELDS, f"{where}.", noun="field")
        if "price_per_hour" not in e and name not in base:
            raise SchemaError(f"{where}.price_per_hour", "missing")
        values = {k: check(_CHECKS[k], v, f"{where}.{k}") for k, v in e.items()
                  if k in _CHECKS}
        if "cpu_memory_bytes" in values and values["cpu_memory_bytes"] > MAX_BYTES:
            raise SchemaError(f"{where}.cpu_memory_bytes", f"must be <= {MAX_BYTES:g}")
        proc = dict(base[name].proc_ms) if name in base else {}
        for model, ms in check(json_object, e.get("proc_ms", {}), f"{where}.proc_ms").items():
            if not isinstance(model, str) or not NAME.match(model):
                raise SchemaError(f"{where}.proc_ms", f"bad model name {model!r}")
            proc[model] = float(check(_PROC_MS, ms, f"{where}.proc_ms.{model}"))
        inherited = {k: getattr(base[name], k) for k in FIELDS} if name in base else {}
        out[name] = NodeType(**{**inherited, **values, "name": name, "proc_ms": proc})
    return out


def node_types_option(data: Any) -> dict[str, NodeType]:
    """The config file's ``node_types`` checker."""
    return parse_node_types(data)
