"""The model catalog: each model's SLO and priority, as set through ``PUT /v1/models/{name}``
or ``edgeagent coordinator models set``. Only catalogued models are planned.

JSON (every field but ``slo_ms`` optional)::

    {"slo_ms": 200, "percentile": 99, "priority": 1, "cpu_per_replica": 1,
     "memory_per_replica_bytes": 0, "proc_ms": null}

``proc_ms`` is the processing time used until nodes have measured one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from agent.errors import AgentError
from agent.validation import number
from agent.wire import NAME


class CatalogError(AgentError, ValueError):
    """A catalog entry with a missing, unknown or out-of-range field."""

    status = 400


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


_POSITIVE = number(0, strict_lo=True, finite=True)
_FIELDS = {
    "slo_ms": _POSITIVE,
    "percentile": number(0, 100, strict_lo=True, strict_hi=True, finite=True),
    "priority": number(0, finite=True),
    "cpu_per_replica": _POSITIVE,
    "memory_per_replica_bytes": number(0, finite=True),
    "proc_ms": _POSITIVE,
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
    for key, check in _FIELDS.items():
        if key not in data or (key == "proc_ms" and data[key] is None):
            continue
        try:
            values[key] = float(check(data[key]))
        except ValueError as exc:
            raise CatalogError(f"field {key!r} {exc}") from None
    return ModelSLO(name=name, **values)
