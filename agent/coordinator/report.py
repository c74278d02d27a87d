"""What a node reports (``POST /v1/nodes/{name}/report``) and its validation.

JSON (only ``capacity`` is required; ``models`` maps names to per-model stats)::

    {"capacity": {"cores": 8, "cpu_memory_bytes": 2147483648,
                  "gpus": [{"device": "cuda:0", "memory_bytes": 12884901888}]},
     "models": {"resnet": {
        "device": "cpu", "resident": true, "pinned": false, "size_bytes": 102760448,
        "load_seconds": 0.41, "workers": 2,
        "arrivals": [[12.0, 5.0, 140], [7.0, 5.0, 155]],
        "batches": {"1": {"count": 9000, "seconds": 180.0}, "4": {"count": 10, "seconds": 0.5}},
        "batch_ms": {"1": 20.0, "4": 50.0},
        "latency_ms": {"p50": 21.0, "p99": 48.5}, "requests": 155, "drops": 0}}}

``arrivals`` are ``[age_s, seconds, count]``: ``count`` requests arrived in the
``seconds`` that ended ``age_s`` before the report was sent (ages, not timestamps, so
node clocks need not agree with the coordinator's). ``batches`` are cumulative since the
agent started: batches run per batch size and their total processing seconds.
``batch_ms`` is the node's current processing-time profile (ms per batch size; shown,
not planned with).
``latency_ms``, ``requests`` and ``drops`` cover the last report interval only.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from agent.coordinator.catalog import NAME

MAX_ARRIVALS = 2000
_PERCENTILE_KEY = re.compile(r"^p(\d{1,2}(?:\.\d+)?)$")


class ReportError(ValueError):
    """A report with a missing or malformed field; the message names the field."""


@dataclass(frozen=True)
class GpuCapacity:
    device: str
    memory_bytes: float


@dataclass(frozen=True)
class NodeCapacity:
    """What a node offers the planner: cores, model memory on CPU and per GPU."""

    cores: float
    cpu_memory_bytes: float
    gpus: tuple[GpuCapacity, ...] = ()


@dataclass(frozen=True)
class ModelReport:
    """One model's state and recent stats on one node."""

    name: str
    device: str = "cpu"
    resident: bool = False
    pinned: bool = False
    size_bytes: float = 0.0
    load_seconds: float = 0.0
    workers: int | None = None
    arrivals: tuple[tuple[float, float, float], ...] = ()
    batches: dict[int, tuple[float, float]] = field(default_factory=dict)  # b -> (n, s)
    latency_ms: dict[float, float] = field(default_factory=dict)  # percentile -> ms
    requests: float = 0.0
    drops: float = 0.0

    def busy_seconds_per_request(self) -> tuple[float, float]:
        """(processing seconds, requests processed) summed over all batch sizes."""
        seconds = sum(s for _, s in self.batches.values())
        done = sum(b * n for b, (n, _) in self.batches.items())
        return seconds, done


@dataclass(frozen=True)
class NodeReport:
    node: str
    capacity: NodeCapacity
    models: dict[str, ModelReport]


def _num(value: Any, where: str, *, lo: float = 0.0, integer: bool = False) -> float:
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or not math.isfinite(value) or value < lo:
        kind = "an integer" if integer else "a number"
        raise ReportError(f"{where}: must be {kind} >= {lo:g}, got {value!r}")
    return value


def _obj(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise ReportError(f"{where}: must be a JSON object, got {type(value).__name__}")
    return value


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ReportError(f"{where}: must be true or false, got {value!r}")
    return value


def _only(data: dict, allowed: tuple[str, ...], where: str) -> None:
    for key in data:
        if key not in allowed:
            prefix = f"{where}." if where else ""
            raise ReportError(f"{prefix}{key}: unknown field (expected one of: "
                              f"{', '.join(allowed)})")


def _capacity(data: Any) -> NodeCapacity:
    d = _obj(data, "capacity")
    _only(d, ("cores", "cpu_memory_bytes", "gpus"), "capacity")
    if "cores" not in d:
        raise ReportError("capacity.cores: missing")
    cores = _num(d["cores"], "capacity.cores")
    if cores <= 0:
        raise ReportError(f"capacity.cores: must be > 0, got {cores!r}")
    gpus = d.get("gpus", [])
    if not isinstance(gpus, list):
        raise ReportError("capacity.gpus: must be a list")
    parsed = []
    for i, g in enumerate(gpus):
        g = _obj(g, f"capacity.gpus[{i}]")
        device = g.get("device")
        if not isinstance(device, str) or not device:
            raise ReportError(f"capacity.gpus[{i}].device: must be a device name such as cuda:0")
        parsed.append(GpuCapacity(device, _num(g.get("memory_bytes"),
                                               f"capacity.gpus[{i}].memory_bytes")))
    return NodeCapacity(cores, _num(d.get("cpu_memory_bytes", 0), "capacity.cpu_memory_bytes"),
                        tuple(parsed))


_MODEL_FIELDS = ("device", "resident", "pinned", "size_bytes", "load_seconds", "workers",
                 "arrivals", "batches", "batch_ms", "latency_ms", "requests", "drops",
                 "state")


def _model(name: str, data: Any) -> ModelReport:
    where = f"models.{name}"
    if not isinstance(name, str) or not NAME.match(name):
        raise ReportError(f"models: bad model name {name!r}")
    d = _obj(data, where)
    _only(d, _MODEL_FIELDS, where)
    arrivals = d.get("arrivals", [])
    if not isinstance(arrivals, list) or len(arrivals) > MAX_ARRIVALS:
        raise ReportError(f"{where}.arrivals: must be a list of at most {MAX_ARRIVALS} "
                          "[age_s, seconds, count] triples")
    points = []
    for i, p in enumerate(arrivals):
        if not isinstance(p, list) or len(p) != 3:
            raise ReportError(f"{where}.arrivals[{i}]: must be [age_s, seconds, count]")
        age, secs, count = (_num(v, f"{where}.arrivals[{i}]") for v in p)
        if secs <= 0:
            raise ReportError(f"{where}.arrivals[{i}]: seconds must be > 0")
        points.append((float(age), float(secs), float(count)))
    batches = {}
    for key, value in _obj(d.get("batches", {}), f"{where}.batches").items():
        if not (isinstance(key, str) and key.isdigit() and int(key) >= 1):
            raise ReportError(f"{where}.batches: keys must be batch sizes >= 1, got {key!r}")
        v = _obj(value, f"{where}.batches.{key}")
        _only(v, ("count", "seconds"), f"{where}.batches.{key}")
        batches[int(key)] = (float(_num(v.get("count"), f"{where}.batches.{key}.count")),
                             float(_num(v.get("seconds"), f"{where}.batches.{key}.seconds")))
    for key, value in _obj(d.get("batch_ms", {}), f"{where}.batch_ms").items():
        if not (isinstance(key, str) and key.isdigit() and int(key) >= 1):
            raise ReportError(f"{where}.batch_ms: keys must be batch sizes >= 1, got {key!r}")
        _num(value, f"{where}.batch_ms.{key}")
    latency = {}
    for key, value in _obj(d.get("latency_ms", {}), f"{where}.latency_ms").items():
        m = _PERCENTILE_KEY.match(key) if isinstance(key, str) else None
        if not m or not 0 < float(m.group(1)) < 100:
            raise ReportError(f"{where}.latency_ms: keys must look like p50 or p99.9, "
                              f"got {key!r}")
        if value is not None:
            latency[float(m.group(1))] = float(_num(value, f"{where}.latency_ms.{key}"))
    workers = d.get("workers")
    device = d.get("device", "cpu")
    if not isinstance(device, str) or not device:
        raise ReportError(f"{where}.device: must be cpu or cuda:N, got {device!r}")
    return ModelReport(
        name=name, device=device,
        resident=_bool(d.get("resident", False), f"{where}.resident"),
        pinned=_bool(d.get("pinned", False), f"{where}.pinned"),
        size_bytes=float(_num(d.get("size_bytes", 0), f"{where}.size_bytes")),
        load_seconds=float(_num(d.get("load_seconds", 0), f"{where}.load_seconds")),
        workers=None if workers is None else int(_num(workers, f"{where}.workers",
                                                      integer=True)),
        arrivals=tuple(points), batches=batches, latency_ms=latency,
        requests=float(_num(d.get("requests", 0), f"{where}.requests")),
        drops=float(_num(d.get("drops", 0), f"{where}.drops")),
    )


def parse_report(node: str, data: Any) -> NodeReport:
    """Validate a report body; ``ReportError`` names the first bad field."""
    if not isinstance(node, str) or not NAME.match(node):
        raise ReportError(f"node name must be 1-128 letters, digits, '_', '.' or '-', "
                          f"got {node!r}")
    d = _obj(data, "report")
    _only(d, ("capacity", "models", "interval_s"), "")
    if "capacity" not in d:
        raise ReportError("capacity: missing (cores, cpu_memory_bytes, gpus)")
    if "interval_s" in d:
        _num(d["interval_s"], "interval_s")
    models = {name: _model(name, m)
              for name, m in _obj(d.get("models", {}), "models").items()}
    return NodeReport(node, _capacity(d["capacity"]), models)


def latency_at(model: ModelReport, percentile: float) -> float | None:
    """The reported latency (ms) at the smallest reported percentile >= ``percentile``
    (the highest one when none is that high); None when nothing was measured."""
    if not model.latency_ms:
        return None
    above = [p for p in model.latency_ms if p >= percentile - 1e-9]
    return model.latency_ms[min(above) if above else max(model.latency_ms)]
