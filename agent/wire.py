"""The wire schema between nodes and the coordinator: what a node reports
(``POST /v1/nodes/{name}/report``) and the directives that come back, with their
validation. Both sides import this module; neither imports the other.

**Report** (JSON; only ``capacity`` is required; ``models`` maps names to per-model stats)::

    {"node_type": "c5.2xlarge",
     "capacity": {"cores": 8, "cpu_memory_bytes": 2147483648,
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
``node_type`` (optional, the agent config's ``coordinator.node_type``) names the kind of
machine, a key of the coordinator's ``node_types`` price table (fleet sizing and
provisioning); nodes without one are not counted there.

**Directives**, the answer to every report, valid for ``ttl_s`` seconds::

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

import re
from dataclasses import dataclass, field
from typing import Any

from agent.errors import AgentError
from agent.validation import (SchemaError, ascii_int, boolean, check, json_object, number,
                              only)

#: Node and model names: 1-128 letters, digits, '_', '.' or '-', not starting with a sign.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")
MAX_ARRIVALS = 2000
MAX_STATE = 64  # characters of a model's state (shown, not planned with)
_PERCENTILE_KEY = re.compile(r"^p(\d{1,2}(?:\.\d+)?)$")


# -- reports -----------------------------------------------------------------------------


class ReportError(SchemaError, AgentError):
    """A report with a missing or malformed field; the message names the field."""

    status = 400


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
    node_type: str | None = None


# Physical bounds on every number in a report: a value past them is a broken or hostile
# node, refused at ingestion (400) so that it never reaches the planner (1e308 arrivals
# would overflow every plan of the fleet).
MAX_COUNT = 1e15            # requests, drops, batches, arrivals in one window
MAX_BYTES = float(2 ** 60)  # 1 EiB: memory of a node, a GPU, a model
MAX_SECONDS = 1e9           # ages, windows, load and busy times (about 31 years)
MAX_MS = 1e9                # latencies
MAX_CORES = 1e6
MAX_RATE = 1e9              # requests per second in one arrivals window

_COUNT = number(0.0, MAX_COUNT, finite=True)
_BYTES = number(0.0, MAX_BYTES, finite=True)
_SECONDS = number(0.0, MAX_SECONDS, finite=True)
_MS = number(0.0, MAX_MS, finite=True)
_CORES = number(0.0, MAX_CORES, finite=True)
_INTEGER = number(0, MAX_CORES, integer=True, finite=True)


# The upper bound of each checker above: a plain int or float in [0, bound] passes it
# (nan and inf fail the comparison, bools are not int), checked without the call layers;
# anything else takes the checker's path and its message. A fleet's reports come here
# at thousands per second.
_UPPER = {_COUNT: MAX_COUNT, _BYTES: MAX_BYTES, _SECONDS: MAX_SECONDS, _MS: MAX_MS}



def _count(value: Any, where: str, checker=_COUNT) -> float:
    kind = type(value)
    if (kind is float or kind is int) and 0.0 <= value <= _UPPER.get(checker, -1.0):
        return float(value)
    return float(check(checker, value, where))


def _obj(value: Any, where: str) -> dict:
    if type(value) is dict:  # the common case without the call layers
        return value
    return check(json_object, value, where)


def _capacity(data: Any) -> NodeCapacity:
    d = _obj(data, "capacity")
    only(d, ("cores", "cpu_memory_bytes", "gpus"), "capacity.", noun="field")
    if "cores" not in d:
        raise ReportError("capacity.cores", "missing")
    cores = check(_CORES, d["cores"], "capacity.cores")
    if cores <= 0:
        raise ReportError("capacity.cores", f"must be > 0, got {cores!r}")
    gpus = d.get("gpus", [])
    if not isinstance(gpus, list):
        raise ReportError("capacity.gpus", "must be a list")
    parsed = []
    for i, g in enumerate(gpus):
        g = _obj(g, f"capacity.gpus[{i}]")
        only(g, ("device", "memory_bytes"), f"capacity.gpus[{i}].", noun="field")
        device = g.get("device")
        if not isinstance(device, str) or not device:
            raise ReportError(f"capacity.gpus[{i}].device",
                              "must be a device name such as cuda:0")
        parsed.append(GpuCapacity(device, check(_BYTES, g.get("memory_bytes"),
                                                f"capacity.gpus[{i}].memory_bytes")))
    return NodeCapacity(cores, check(_BYTES, d.get("cpu_memory_bytes", 0),
                                     "capacity.cpu_memory_bytes"), tuple(parsed))


_MODEL_FIELDS = ("device", "resident", "pinned", "size_bytes", "load_seconds", "workers",
                 "arrivals", "batches", "batch_ms", "latency_ms", "requests", "drops",
                 "state")


_SMALL_SIZES = {str(b): b for b in range(1, 1025)}  # the batch sizes that occur


def _batch_size(key: Any, where: str) -> int:
    size = _SMALL_SIZES.get(key) if isinstance(key, str) else None
    if size is not None:
        return size
    try:
        size = ascii_int(key, "a batch size", max_digits=9)
    except ValueError:
        size = 0
    if size < 1:
        raise ReportError(where, f"keys must be batch sizes >= 1, got {key!r}")
    return size


_MODEL_FIELD_SET = frozenset(_MODEL_FIELDS)
_PLAIN_PERCENTILES = {f"p{q}": float(q) for q in (
    *range(1, 100), 99.5, 99.9, 99.95, 99.99, 99.999)}  # keys _PERCENTILE_KEY accepts


def _plain_model(name: str, d: dict) -> ModelReport | None:
    """``d`` as a ModelReport when every field is plain and in range (what agents send),
    else None: then ``_model`` checks it field by field and names what is wrong. The
    same rules as ``_model`` on a subset of inputs, without building a field's path per
    value (a fleet's reports come here at thousands per second)."""
    if not d.keys() <= _MODEL_FIELD_SET:
        return None
    get = d.get
    points = []
    arrivals = get("arrivals", [])
    if type(arrivals) is not list or len(arrivals) > MAX_ARRIVALS:
        return None
    for p in arrivals:
        if type(p) is not list or len(p) != 3:
            return None
        age, secs, count = p
        if not ((type(age) is float or type(age) is int) and 0.0 <= age <= MAX_SECONDS
                and (type(secs) is float or type(secs) is int) and 0.0 < secs <= MAX_SECONDS
                and (type(count) is float or type(count) is int) and 0.0 <= count <= MAX_COUNT
                and count / secs <= MAX_RATE):
            return None
        points.append((float(age), float(secs), float(count)))
    batches = {}
    raw = get("batches", {})
    if type(raw) is not dict:
        return None
    for key, v in raw.items():
        size = _SMALL_SIZES.get(key) if type(key) is str else None
        if size is None or type(v) is not dict or len(v) != 2:
            return None
        n, secs = v.get("count"), v.get("seconds")
        if not ((type(n) is float or type(n) is int) and 0.0 <= n <= MAX_COUNT
                and (type(secs) is float or type(secs) is int) and 0.0 <= secs <= MAX_SECONDS):
            return None
        batches[size] = (float(n), float(secs))
    raw = get("batch_ms", {})
    if type(raw) is not dict:
        return None
    for key, v in raw.items():
        if type(key) is not str or key not in _SMALL_SIZES \
                or not ((type(v) is float or type(v) is int) and 0.0 <= v <= MAX_MS):
            return None
    latency = {}
    raw = get("latency_ms", {})
    if type(raw) is not dict:
        return None
    for key, v in raw.items():
        q = _PLAIN_PERCENTILES.get(key) if type(key) is str else None
        if q is None:
            return None
        if v is not None:
            if not ((type(v) is float or type(v) is int) and 0.0 <= v <= MAX_MS):
                return None
            latency[q] = float(v)
    device, resident, pinned = get("device", "cpu"), get("resident", False), get("pinned", False)
    size, load, state = get("size_bytes", 0), get("load_seconds", 0), get("state", "")
    requests, drops, workers = get("requests", 0), get("drops", 0), get("workers")
    if not (type(device) is str and device and type(resident) is bool
            and type(state) is str and len(state) <= MAX_STATE
            and type(pinned) is bool
            and (type(size) is float or type(size) is int) and 0.0 <= size <= MAX_BYTES
            and (type(load) is float or type(load) is int) and 0.0 <= load <= MAX_SECONDS
            and (type(requests) is float or type(requests) is int)
            and 0.0 <= requests <= MAX_COUNT
            and (type(drops) is float or type(drops) is int) and 0.0 <= drops <= MAX_COUNT
            and (workers is None or type(workers) is int and 0 <= workers <= MAX_CORES)):
        return None
    return ModelReport(name=name, device=device, resident=resident, pinned=pinned,
                       size_bytes=float(size), load_seconds=float(load), workers=workers,
                       arrivals=tuple(points), batches=batches, latency_ms=latency,
                       requests=float(requests), drops=float(drops))


def _model(name: str, data: Any) -> ModelReport:
    if type(data) is dict and type(name) is str and NAME.match(name):
        plain = _plain_model(name, data)
        if plain is not None:
            return plain
    where = f"models.{name}"
    if not isinstance(name, str) or not NAME.match(name):
        raise ReportError("models", f"bad model name {name!r}")
    d = _obj(data, where)
    only(d, _MODEL_FIELDS, f"{where}.", noun="field")
    arrivals = d.get("arrivals", [])
    if not isinstance(arrivals, list) or len(arrivals) > MAX_ARRIVALS:
        raise ReportError(f"{where}.arrivals", f"must be a list of at most {MAX_ARRIVALS} "
                          "[age_s, seconds, count] triples")
    points = []
    for i, p in enumerate(arrivals):
        if not isinstance(p, list) or len(p) != 3:
            raise ReportError(f"{where}.arrivals[{i}]", "must be [age_s, seconds, count]")
        at = f"{where}.arrivals[{i}]"
        age, secs, count = (_count(p[0], at, _SECONDS), _count(p[1], at, _SECONDS),
                            _count(p[2], at, _COUNT))
        if secs <= 0:
            raise ReportError(f"{where}.arrivals[{i}]", "seconds must be > 0")
        if count / secs > MAX_RATE:
            raise ReportError(f"{where}.arrivals[{i}]", f"{count:g} requests in {secs:g} s "
                              f"is over {MAX_RATE:g} per second")
        points.append((age, secs, count))
    batches = {}
    for key, value in _obj(d.get("batches", {}), f"{where}.batches").items():
        size = _batch_size(key, f"{where}.batches")
        v = _obj(value, f"{where}.batches.{key}")
        only(v, ("count", "seconds"), f"{where}.batches.{key}.", noun="field")
        batches[size] = (_count(v.get("count"), f"{where}.batches.{key}.count"),
                         _count(v.get("seconds"), f"{where}.batches.{key}.seconds", _SECONDS))
    for key, value in _obj(d.get("batch_ms", {}), f"{where}.batch_ms").items():
        _batch_size(key, f"{where}.batch_ms")
        _count(value, f"{where}.batch_ms.{key}", _MS)
    latency = {}
    for key, value in _obj(d.get("latency_ms", {}), f"{where}.latency_ms").items():
        m = _PERCENTILE_KEY.match(key) if isinstance(key, str) else None
        if not m or not 0 < float(m.group(1)) < 100:
            raise ReportError(f"{where}.latency_ms",
                              f"keys must look like p50 or p99.9, got {key!r}")
        if value is not None:
            latency[float(m.group(1))] = _count(value, f"{where}.latency_ms.{key}", _MS)
    workers = d.get("workers")
    device = d.get("device", "cpu")
    if not isinstance(device, str) or not device:
        raise ReportError(f"{where}.device", f"must be cpu or cuda:N, got {device!r}")
    state = d.get("state", "")
    if not isinstance(state, str) or len(state) > MAX_STATE:
        raise ReportError(f"{where}.state", f"must be a string of at most {MAX_STATE} "
                          f"characters such as ready, got {type(state).__name__}")
    return ModelReport(
        name=name, device=device,
        resident=check(boolean, d.get("resident", False), f"{where}.resident"),
        pinned=check(boolean, d.get("pinned", False), f"{where}.pinned"),
        size_bytes=_count(d.get("size_bytes", 0), f"{where}.size_bytes", _BYTES),
        load_seconds=_count(d.get("load_seconds", 0), f"{where}.load_seconds", _SECONDS),
        workers=None if workers is None else int(check(_INTEGER, workers, f"{where}.workers")),
        arrivals=tuple(points), batches=batches, latency_ms=latency,
        requests=_count(d.get("requests", 0), f"{where}.requests"),
        drops=_count(d.get("drops", 0), f"{where}.drops"),
    )


def parse_report(node: str, data: Any) -> NodeReport:
    """Validate a report body; ``ReportError`` names the first bad field. Every field
    of a report is checked, so one that passes nests at most 5 deep (its JSON needs
    no depth limit beyond the parser's own)."""
    if not isinstance(node, str) or not NAME.match(node):
        raise ReportError(None, f"node name must be 1-128 letters, digits, '_', '.' or '-', "
                          f"got {node!r}")
    try:
        d = _obj(data, "report")
        only(d, ("capacity", "models", "interval_s", "node_type"), noun="field")
        if "capacity" not in d:
            raise ReportError("capacity", "missing (cores, cpu_memory_bytes, gpus)")
        if "interval_s" in d:
            _count(d["interval_s"], "interval_s", _SECONDS)
        models = {name: _model(name, m)
                  for name, m in _obj(d.get("models", {}), "models").items()}
        node_type = d.get("node_type")
        if node_type is not None and (not isinstance(node_type, str)
                                      or not NAME.match(node_type)):
            raise ReportError("node_type", "must be 1-128 letters, digits, '_', '.' or "
                              f"'-', got {node_type!r}")
        return NodeReport(node, _capacity(d["capacity"]), models, node_type)
    except ReportError:
        raise
    except SchemaError as exc:
        raise ReportError(exc.key, exc.message) from None


def latency_points(latency_ms: dict[float, float]) -> tuple[tuple[float, float], ...]:
    """A model's reported latencies (``ModelReport.latency_ms``) as (percentile, ms)
    pairs by percentile, what ``latency_at`` reads: tuples of floats, which the garbage
    collector stops tracking (the coordinator keeps them for every node)."""
    return tuple(sorted(latency_ms.items()))


def latency_at(points: tuple[tuple[float, float], ...], percentile: float) -> float | None:
    """From ``latency_points``: the latency (ms) at the smallest reported percentile
    >= ``percentile`` (the highest one when none is that high); None when nothing was
    measured."""
    for p, ms in points:
        if p >= percentile - 1e-9:
            return ms
    return points[-1][1] if points else None


# -- directives --------------------------------------------------------------------------


_TTL = number(0, strict_lo=True, finite=True)


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
        ttl = check(_TTL, data.get("ttl_s"), "ttl_s")
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
