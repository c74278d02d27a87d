"""The model catalog: each model's SLO and priority, as set through ``PUT /v1/models/{name}``
or ``edgeagent coordinator models set``. Only catalogued models are planned.

JSON (every field but ``slo_ms`` optional)::

    {"slo_ms": 200, "percentile": 99, "priority": 1, "cpu_per_replica": 1,
     "memory_per_replica_bytes": 0, "proc_ms": null}

``proc_ms`` is the processing time used until nodes have measured one.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from agent.wire import NAME


class CatalogError(ValueError):
    """A catalog entry with a missing, unknown or out-of-range field."""


@dataclass(frozen=True)
class ModelSLO:
    """One catalogued model: latency SLO at a percentile, priority π, replica needs."""

    name: str
    slo_ms: float
    percentile: float = 99.0
    priority: float = 1.0
    cpu_per_replica: float = 1.0
    memory_per_replica_bytes: float = 0.0
    proc_ms: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


_FIELDS = {  # field -> (lower bound, exclusive?, upper bound)
    "slo_ms": (0.0, True, None),
    "percentile": (0.0, True, 100.0),
    "priority": (0.0, False, None),
    "cpu_per_replica": (0.0, True, None),
    "memory_per_replica_bytes": (0.0, False, None),
    "proc_ms": (0.0, True, None),
}


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME.match(name):
        raise CatalogError(f"model name must be 1-128 letters, digits, '_', '.' or '-', "
                           f"got {name!r}")
    return name


def parse_slo(name: str, data: Any) -> ModelSLO:
    """A ``ModelSLO`` from a JSON object; ``CatalogError`` names the bad field."""
    check_name(name)
    if not isinstance(data, dict):
        raise CatalogError("body must be a JSON object such as {\"slo_ms\": 200}")
    unknown = sorted(set(data) - set(_FIELDS) - {"name"})
    if unknown:
        raise CatalogError(f"unknown field {unknown[0]!r} (expected: {', '.join(_FIELDS)})")
    if "name" in data and data["name"] != name:
        raise CatalogError(f"field 'name' is {data['name']!r} but the URL names {name!r}")
    if "slo_ms" not in data:
        raise CatalogError("missing field 'slo_ms' (the latency SLO in milliseconds)")
    values: dict[str, float | None] = {}
    for key, (lo, exclusive, hi) in _FIELDS.items():
        if key not in data or (key == "proc_ms" and data[key] is None):
            continue
        v = data[key]
        bound = f"{'>' if exclusive else '>='} {lo:g}" + (f" and < {hi:g}" if hi else "")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or (v <= lo if exclusive else v < lo) or (hi is not None and v >= hi):
            raise CatalogError(f"field {key!r} must be a number {bound}, got {v!r}")
        values[key] = float(v)
    return ModelSLO(name=name, **values)
