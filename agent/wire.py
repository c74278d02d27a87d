"""The wire schema between nodes and the coordinator: what a node reports
(``POST /v1/nodes/{name}/report``) and the directives that come back. Both sides import
this module; neither imports the other.

Each is declared once, as msgspec Structs whose annotations carry the bounds: msgspec
decodes a body straight into them (``parse_report``), and a body that does not fit gets
the first bad field named (``agent.schema.decode``).

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
``disk`` (optional) lists the model versions whose files the node holds in its disk tier,
``pulling`` those being downloaded (bytes so far, of ``total`` when known)::

    "disk": [{"model": "resnet", "version": 2, "bytes": 102760448}],
    "pulling": [{"model": "bert", "version": 1, "bytes": 1048576, "total": 438000000}]

``version_stats`` (optional; for the models the last answer's ``model_versions`` names
with a ``rollout``) gives each version the node served or tried to load, with counters
**cumulative since the agent started** (a gate takes the difference over its window; a
restart, counters going down, starts them again)::

    "version_stats": {"resnet": [
        {"version": 2, "serving": true, "state": "ready", "size_bytes": 102760448,
         "requests": 1200, "errors": 3, "load_failures": 0, "ok": 1190,
         "latency_buckets": [[0.5, 10], [1.0, 400], [2.5, 1100]],
         "latency_ms": {"p50": 1.2, "p99": 2.4}, "error": null}]}

``errors``: 5xx answers; ``latency_buckets``: the successes' (``ok``) cumulative
histogram (``[upper bound ms, count]``); ``latency_ms``: the last interval's percentiles
(shown, not gated on); ``error``: why it cannot serve (its failed load or pull).

``peer`` (optional) is where the other nodes reach this one (``coordinator.advertise_url``
and its gRPC address); ``routing`` (optional, from nodes that route) names the routing
table the node holds and its routed traffic over the last interval, per model::

    "peer": {"url": "http://10.0.0.7:8000", "grpc": "10.0.0.7:8001"},
    "routing": {"version": 4711, "models": {"resnet": {
        "served": 140, "forwarded": 15, "received": 40, "fallbacks": 1, "errors": 1}}}

``served``: requests answered here (``received`` of them forwarded here by a peer);
``forwarded``: answered by a peer; ``fallbacks``: planned elsewhere but served here (no
peer could), ``errors`` of them after a forward failed. A model's ``arrivals`` count
the requests that reached the fleet here, never those a peer forwarded here, so the
fleet's arrivals are the sum over nodes; a model the node's repository lacks but
forwards has its ``arrivals`` (and its requests' ``latency_ms``) under ``routing``.

**Directives**, the answer to every report, valid for ``ttl_s`` seconds::

    {"node": "edge-1", "plan_id": 7, "ttl_s": 60,
     "workers": {"resnet": 2}, "pin": ["resnet"], "prefetch": ["resnet"],
     "drop_rate": {"bert": 0.05},
     "pull": [{"model": "resnet", "source": "s3://models/resnet",
               "source_options": {"endpoint_url": "http://10.0.0.9:9000"}, "version": 2,
               "digest": null, "config": {"max_batch_size": 8}, "load": true}],
     "drop": ["vit"]}

``workers``: replicas of the plan on this node (the model's worker count). ``pin``: keep
these resident (the plan runs replicas here). ``prefetch``: of those, the ones not
resident yet: load them now. ``drop_rate``: the share of requests to shed (penalty
objectives only; absent means 0). A node reverts what it applied when directives are
not renewed within ``ttl_s`` (coordinator gone): a missing coordinator never leaves
models pinned forever. ``pull``: catalogued models with a source that the plan assigns
this node: where to pull them from (``version`` None: the source's newest), the model
config to serve them with, and whether to load them now; never credentials (the node
has its own). ``drop``: models the node holds from an earlier pull that the plan moved
away (the node removes them once idle). A lapsed pull is not undone, just not renewed.
Both sides keep directives in a ``DirectiveBook``.

``model_versions`` (optional; the rollouts') pins per model the version served:
``serve`` (exactly this one, rolled to as a new version is), ``keep`` (kept on disk and,
where memory allows, loaded: what a rollback switches to), ``bad`` (never served by
default: marked bad in the catalog), ``rollout`` (the one under way: report its
``version_stats``); unlike the rest it does not lapse with ``ttl_s``, restarts included::

    "model_versions": {"resnet": {"serve": 2, "keep": [1], "bad": [3], "rollout": 7}}

``routing_version`` (to nodes that route) names the coordinator's routing table;
``routing`` carries the table itself when the node's report named another version::

    "routing_version": 4712,
    "routing": {"version": 4712, "max_age_s": 60,
                "nodes": {"edge-1": {"url": "http://10.0.0.7:8000", "grpc": "10.0.0.7:8001"}},
                "models": {"resnet": {"edge-1": 2, "edge-3": 1}, "bert": {}}}

``models``: per catalogued or planned model, the live nodes that run it under the plan
and their replicas (the weights requests are spread by); none: served where it lands.
``max_age_s``: past this without a confirmation the node stops trusting the table.

``answer`` (from coordinators that take leases) is the version of the whole answer, its
directives and routing table together: the same directives and table, the same version.

**Leases** (``POST /v1/nodes/{name}/lease``). A node whose coordinator's answers carry
``answer`` sends its full report only when something the planner uses changed (or every
``coordinator.full_report_s``: ``agent.node.lease``) and otherwise renews a lease at its
interval, a few bytes naming its last full report that was answered (``report_id``, a
number the node draws for each full report and sends in it) and the answer and routing
table it holds::

    {"report": 8412993001, "answer": 190734112, "routing": 4712}

A node's first message is a lease naming no report (``{}``): a coordinator that takes
leases answers ``{"report": true}``, and the node's full reports then carry the fields
of leases; an older one refuses the path (404, or 403 where it needs an admin token for
a path it does not know), and the node sends it plain full reports every interval, as
before (trying a lease again every ``full_report_s``). Its answer is ``{"answer": 190734112}`` when that answer stands (the directives are
renewed for their ``ttl_s``, the routing table confirmed), the whole new answer
(directives as above, with ``answer``) when it changed, and ``{"report": true}`` when the
coordinator does not hold that report (it restarted, or the lease reached a report
worker that never saw it): the node then sends its full report at once. A full report
from such a node carries per model ``rate``: requests per second over its last minute,
what the coordinator takes it to go on receiving until its next full report (its
``arrivals`` since the last full report come with that one).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Mapping
from urllib.parse import urlsplit

from msgspec import Meta, Struct

from agent.errors import AgentError
from agent.schema import decode, expected
from agent.validation import SchemaError, load_json

#: Node and model names: 1-128 letters, digits, '_', '.' or '-', not starting with a sign.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}\Z")
_NAMED = "1-128 letters, digits, '_', '.' or '-'"
MAX_ARRIVALS = 2000
MAX_STATE = 64  # characters of a model's state (shown, not planned with)

# Physical bounds on every number in a report: a value past them is a broken or hostile
# node, refused at ingestion (400) so that it never reaches the planner (1e308 arrivals
# would overflow every plan of the fleet).
MAX_COUNT = 1e15            # requests, drops, batches, arrivals in one window
MAX_BYTES = float(2 ** 60)  # 1 EiB: memory of a node, a GPU, a model
MAX_SECONDS = 1e9           # ages, windows, load and busy times (about 31 years)
MAX_MS = 1e9                # latencies
MAX_CORES = 1e6
MAX_RATE = 1e9              # requests per second in one arrivals window
MAX_ID = 2 ** 53            # report ids and answer versions: exact in every JSON reader

Count = Annotated[float, Meta(ge=0, le=MAX_COUNT)]
Bytes = Annotated[float, Meta(ge=0, le=MAX_BYTES)]
Seconds = Annotated[float, Meta(ge=0, le=MAX_SECONDS)]
Ms = Annotated[float, Meta(ge=0, le=MAX_MS)]
Rate = Annotated[float, Meta(ge=0, le=MAX_RATE)]
Id = Annotated[int, expected(f"whole numbers from 0 to {MAX_ID}", ge=0, le=MAX_ID)]
NodeTypeName = Annotated[str, expected(_NAMED, pattern=NAME.pattern)]
ModelName = Annotated[str, expected(f"model names of {_NAMED}", pattern=NAME.pattern)]
BatchSize = Annotated[int, expected("batch sizes >= 1", ge=1, le=999_999_999)]
#: ``p50``, ``p99.9``: a percentile above 0 and below 100 (``ModelReport`` checks the
#: keys: a pattern on each would cost msgspec a call into ``re`` per key).
_PERCENTILE = re.compile(r"^p(?!0*(?:\.0*)?\Z)\d{1,2}(?:\.\d+)?\Z")
#: The percentile of each key agents send (``p50`` -> 50.0); others are parsed.
_PERCENTILES = {f"p{q}": float(q) for q in (
    *range(1, 100), 99.5, 99.9, 99.95, 99.99, 99.999)}


# -- reports -----------------------------------------------------------------------------


class ReportError(SchemaError, AgentError):
    """A report with a missing or malformed field; the message names the field."""

    status = 400


class GpuCapacity(Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    device: Annotated[str, expected("a device name such as cuda:0", min_length=1)]
    memory_bytes: Bytes


class NodeCapacity(Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """What a node offers the planner: cores, model memory on CPU and per GPU."""

    cores: Annotated[float, Meta(gt=0, le=MAX_CORES)]
    cpu_memory_bytes: Bytes = 0.0
    gpus: tuple[GpuCapacity, ...] = ()


class Arrival(Struct, array_like=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """``count`` requests arrived in the ``seconds`` that ended ``age_s`` before the
    report was sent (``[age_s, seconds, count]`` on the wire)."""

    age_s: Seconds
    seconds: Annotated[float, Meta(gt=0, le=MAX_SECONDS)]
    count: Count

    def __post_init__(self) -> None:
        if self.count / self.seconds > MAX_RATE:
            raise ValueError(f"{self.count:g} requests in {self.seconds:g} s is over "
                             f"{MAX_RATE:g} per second")


class BatchCount(Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """Batches of one size run since the agent started, and their processing seconds."""

    count: Count
    seconds: Seconds


class ModelReport(Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """One model's state and recent stats on one node, as the node sent them."""

    device: Annotated[str, expected("a device name such as cpu or cuda:0", min_length=1)] \
        = "cpu"
    resident: bool = False
    pinned: bool = False
    size_bytes: Bytes = 0.0
    load_seconds: Seconds = 0.0
    workers: Annotated[int, Meta(ge=0, le=int(MAX_CORES))] | None = None
    arrivals: Annotated[tuple[Arrival, ...], Meta(max_length=MAX_ARRIVALS)] = ()
    batches: dict[BatchSize, BatchCount] = {}
    batch_ms: dict[BatchSize, Ms] = {}
    latency_ms: dict[str, Ms | None] = {}  # percentile (p50, p99.9) -> ms
    requests: Count = 0.0
    drops: Count = 0.0
    state: Annotated[str, Meta(max_length=MAX_STATE)] = ""
    rate: Rate | None = None

    def __post_init__(self) -> None:
        if not _PERCENTILES.keys() >= self.latency_ms.keys():  # else look at each
            for key in self.latency_ms:
                if not _PERCENTILE.match(key):
                    raise SchemaError("latency_ms", "keys must be percentiles such as p50 "
                                      f"or p99.9, got {key!r}")

    def busy_seconds_per_request(self) -> tuple[float, float]:
        """(processing seconds, requests processed) summed over all batch sizes."""
        seconds = sum(c.seconds for c in self.batches.values())
        done = sum(b * c.count for b, c in self.batches.items())
        return seconds, done


Version = Annotated[int, expected("versions >= 0", ge=0, le=999_999_999)]
MAX_HELD = 100_000  # model versions one node lists on disk or pulling


class DiskHolding(Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """One model version whose files the node holds in its disk tier."""

    model: ModelName
    version: Version
    bytes: Bytes = 0.0


class Pulling(Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """One model version being downloaded: bytes so far, of ``total`` when known."""

    model: ModelName
    version: Version | None = None
    bytes: Bytes = 0.0
    total: Bytes | None = None


MAX_VERSIONS = 64  # versions of one model in ``version_stats``
MAX_BUCKETS = 64  # bounds of one version's latency histogram


class VersionStat(Struct, frozen=True, forbid_unknown_fields=True, gc=False, kw_only=True):
    """One model version on one node (``version_stats``; see the module docstring)."""

    version: Version
    serving: bool = False
    state: Annotated[str, Meta(max_length=MAX_STATE)] = ""
    size_bytes: Bytes = 0.0
    requests: Count = 0.0
    errors: Count = 0.0
    ok: Count = 0.0
    load_failures: Count = 0.0
    latency_buckets: Annotated[tuple[tuple[Ms, Count], ...], Meta(max_length=MAX_BUCKETS)] = ()
    latency_ms: dict[str, Ms | None] = {}
    error: Annotated[str, Meta(max_length=1024)] | None = None


MAX_ADDRESS = 512  # characters of a node's advertised URL or gRPC address
RoutingVersion = Annotated[int, expected("versions >= 0", ge=0, le=2 ** 53)]


class PeerAddress(Struct, frozen=True, gc=False):
    """Where the other nodes reach a node: its HTTP URL and its gRPC ``host:port``."""

    url: Annotated[str, expected("an http:// or https:// URL", max_length=MAX_ADDRESS,
                                 pattern=r"^https?://[^\s/?#@]+\Z")]
    grpc: Annotated[str, expected("host:port", max_length=MAX_ADDRESS,
                                  pattern=r"^[^\s/?#@]+:[0-9]{1,5}\Z")] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "grpc": self.grpc}


class RoutedModel(Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """One model's routed traffic on one node over the last report interval."""

    served: Count = 0.0
    forwarded: Count = 0.0
    received: Count = 0.0
    fallbacks: Count = 0.0
    errors: Count = 0.0
    arrivals: Annotated[tuple[Arrival, ...], Meta(max_length=MAX_ARRIVALS)] = ()
    latency_ms: dict[str, Ms | None] = {}
    rate: Rate | None = None

    def __post_init__(self) -> None:
        if not _PERCENTILES.keys() >= self.latency_ms.keys():
            for key in self.latency_ms:
                if not _PERCENTILE.match(key):
                    raise SchemaError("latency_ms", "keys must be percentiles such as p50 "
                                      f"or p99.9, got {key!r}")


class RoutingReport(Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """What a routing node says of its routing: the table it holds, its traffic."""

    version: RoutingVersion | None = None
    models: dict[ModelName, RoutedModel] = {}


class NodeReport(Struct, frozen=True, forbid_unknown_fields=True, gc=False, kw_only=True):
    """A node's report (``POST /v1/nodes/{name}/report``); only ``capacity`` is required."""

    capacity: NodeCapacity
    models: dict[ModelName, ModelReport] = {}
    interval_s: Seconds = 0.0
    node_type: NodeTypeName | None = None
    disk: Annotated[tuple[DiskHolding, ...], Meta(max_length=MAX_HELD)] = ()
    pulling: Annotated[tuple[Pulling, ...], Meta(max_length=MAX_HELD)] = ()
    version_stats: dict[ModelName, Annotated[tuple[VersionStat, ...],
                                             Meta(max_length=MAX_VERSIONS)]] = {}
    peer: PeerAddress | None = None
    routing: RoutingReport | None = None
    report_id: Id | None = None

    def held(self) -> set[str]:
        """Models whose files the node holds or is pulling, or that it serves."""
        return ({h.model for h in self.disk} | {p.model for p in self.pulling}
                | set(self.models))


def parse_report(node: str, body: bytes | str | Any) -> NodeReport:
    """``node``'s report from ``body`` (JSON text, or data as parsed JSON), decoded
    straight into the types above (``schema.decode``). ``ReportError`` names the first
    bad field; a body that is not JSON is a plain ``ValueError``. A report that passes
    nests at most 5 deep."""
    if not isinstance(node, str) or not NAME.match(node):
        raise ReportError(None, f"node name must be {_NAMED}, got {node!r}")
    try:
        return decode(NodeReport, body)
    except SchemaError as exc:
        raise ReportError(exc.key, exc.message) from None


class NodeLease(Struct, frozen=True, forbid_unknown_fields=True, gc=False, kw_only=True):
    """A node's lease (``POST /v1/nodes/{name}/lease``): the id of its last full report
    that was answered (None: none yet), the answer version it holds and its routing
    table's."""

    report: Id | None = None
    answer: Id | None = None
    routing: RoutingVersion | None = None


def parse_lease(node: str, body: bytes | str | Any) -> NodeLease:
    """``node``'s lease from ``body``; ``ReportError`` names the first bad field, a body
    that is not JSON is a plain ``ValueError`` (as ``parse_report``)."""
    if not isinstance(node, str) or not NAME.match(node):
        raise ReportError(None, f"node name must be {_NAMED}, got {node!r}")
    try:
        return decode(NodeLease, body)
    except SchemaError as exc:
        raise ReportError(exc.key, exc.message) from None


def latency_points(latency_ms: dict[str, float | None]) -> tuple[tuple[float, float], ...]:
    """A model's reported latencies (``ModelReport.latency_ms``) as (percentile, ms)
    pairs by percentile, what ``latency_at`` reads (unmeasured ones left out): tuples of
    floats, which the garbage collector stops tracking (the coordinator keeps them for
    every node)."""
    return tuple(sorted((_PERCENTILES.get(key) or float(key[1:]), ms)
                        for key, ms in latency_ms.items() if ms is not None))


def latency_at(points: tuple[tuple[float, float], ...], percentile: float) -> float | None:
    """From ``latency_points``: the latency (ms) at the smallest reported percentile
    >= ``percentile`` (the highest one when none is that high); None when nothing was
    measured."""
    for p, ms in points:
        if p >= percentile - 1e-9:
            return ms
    return points[-1][1] if points else None


# -- sources ------------------------------------------------------------------------------

MAX_SOURCE_URL = 2048
#: Option keys that name a credential: refused in catalog entries and pull directives
#: (a node takes credentials from its own environment, never from the coordinator).
CREDENTIAL_KEY = re.compile(
    r"secret|passw|token|credential|private|access[_-]?key|session|auth|api[_-]?key|"
    r"signature|cookie|bearer|\bkey\Z|_key\Z", re.I)


def _with_user(url: str) -> bool:
    try:
        parts = urlsplit(url)
        return parts.username is not None or parts.password is not None
    except ValueError:
        return False


def refuse_credentials(url: Any, options: Any = None) -> None:
    """ValueError naming the problem where a model's source (``url`` and its
    ``options``, as a catalog entry or a pull directive carries them) would carry a
    credential: a user, password or query string in the URL (a signed URL), an option
    whose key looks like a credential or whose value is a URL with a user. Neither the
    URL nor a value is echoed. The scheme's own rules are ``agent.sources.open_source``'s."""
    if not isinstance(url, str) or not url or len(url) > MAX_SOURCE_URL:
        raise ValueError(f"source must be a URL of 1-{MAX_SOURCE_URL} characters")
    if _with_user(url):
        raise ValueError("source may not hold a user or password (nodes take credentials "
                         "from their own environment)")
    if urlsplit(url).query:
        raise ValueError("source may not hold a query string (a signed URL carries "
                         "credentials; nodes take them from their own environment)")
    if options is None:
        return
    if not isinstance(options, Mapping):
        raise ValueError(f"source_options must be an object, got {type(options).__name__}")
    secret = sorted(k for k in options if isinstance(k, str) and CREDENTIAL_KEY.search(k))
    if secret:
        raise ValueError(f"source_options {', '.join(map(repr, secret))} look like "
                         "credentials: nodes take credentials from their own environment "
                         "(AWS_* variables, ~/.aws, ~/.docker/config.json), never from "
                         "the catalog")
    for key, value in options.items():
        if not isinstance(key, str) or not NAME.match(key):
            raise ValueError(f"source_options keys must be {_NAMED}, got {key!r}")
        if not isinstance(value, (str, int, float, bool)) and value is not None:
            raise ValueError(f"source_options {key!r} must be a string, number or boolean")
        if isinstance(value, str) and "://" in value and _with_user(value):
            raise ValueError(f"source_options {key!r} may not hold a URL with a user "
                             "or password")


# -- directives --------------------------------------------------------------------------


class Pull(Struct, frozen=True, gc=False, kw_only=True):
    """Pull ``model`` from ``source`` (``version`` None: its newest) and serve it with
    ``config`` (its config.yaml keys); ``load``: load it once pulled."""

    model: ModelName
    source: Annotated[str, Meta(min_length=1, max_length=MAX_SOURCE_URL)]
    source_options: dict[str, Any] = {}  # flat: ``refuse_credentials`` checks them
    version: Version | None = None
    digest: str | None = None
    config: dict[str, Any] = {}
    load: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "source": self.source,
                "source_options": dict(self.source_options), "version": self.version,
                "digest": self.digest, "config": dict(self.config), "load": self.load}


class ModelVersions(Struct, frozen=True, gc=False, kw_only=True):
    """The version a node serves of one model (``model_versions``): exactly ``serve``
    (None: the newest its source lists that is not ``bad``), ``keep`` those at hand,
    never ``bad`` by default; ``rollout``: the rollout under way, whose figures the
    node reports (``version_stats``)."""

    serve: Version | None = None
    keep: tuple[Version, ...] = ()
    bad: tuple[Version, ...] = ()
    rollout: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"serve": self.serve, "keep": list(self.keep), "bad": list(self.bad),
                "rollout": self.rollout}


class RoutingTable(Struct, frozen=True, gc=False, kw_only=True):
    """The coordinator's routing table (see the module docstring): per model the live
    nodes the plan runs it on and their replicas, where those nodes are reached, a
    version and how long a node may go on trusting it unconfirmed."""

    version: RoutingVersion
    max_age_s: Annotated[float, Meta(gt=0, le=MAX_SECONDS)]
    nodes: dict[str, PeerAddress] = {}
    models: dict[str, dict[str, Annotated[int, Meta(ge=1, le=int(MAX_CORES))]]] = {}

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "max_age_s": self.max_age_s,
                "nodes": {n: a.to_json() for n, a in self.nodes.items()},
                "models": {m: dict(w) for m, w in self.models.items()}}


class Directives(Struct, frozen=True, gc=False, kw_only=True):
    """A coordinator's answer to ``node``'s report (fields it does not know are left out:
    a newer coordinator's answer still parses)."""

    node: str = ""
    ttl_s: Annotated[float, Meta(gt=0, le=MAX_SECONDS)]
    plan_id: int | None = None
    workers: dict[str, Annotated[int, Meta(ge=0)]] = {}
    pin: tuple[str, ...] = ()
    prefetch: tuple[str, ...] = ()
    drop_rate: dict[str, Annotated[float, Meta(ge=0, le=1)]] = {}
    pull: tuple[Pull, ...] = ()
    drop: tuple[str, ...] = ()
    model_versions: dict[str, ModelVersions] = {}
    routing_version: int | None = None
    routing: RoutingTable | None = None
    answer: int | None = None

    def to_json(self) -> dict[str, Any]:
        out = {"node": self.node, "plan_id": self.plan_id, "ttl_s": self.ttl_s,
               "workers": dict(self.workers), "pin": list(self.pin),
               "prefetch": list(self.prefetch), "drop_rate": dict(self.drop_rate),
               "pull": [p.to_json() for p in self.pull], "drop": list(self.drop)}
        if self.model_versions:  # only when there is something to say (older nodes)
            out["model_versions"] = {m: v.to_json() for m, v in self.model_versions.items()}
        if self.routing_version is not None:
            out["routing_version"] = self.routing_version
        if self.routing is not None:
            out["routing"] = self.routing.to_json()
        if self.answer is not None:
            out["answer"] = self.answer
        return out

    @classmethod
    def from_json(cls, body: bytes | str | Any) -> Directives:
        """A coordinator's answer (JSON text or parsed); ValueError names what is
        malformed."""
        return decode(cls, body)


class LeaseAnswer(Struct, frozen=True, gc=False, kw_only=True):
    """The short answers to a lease: ``answer``, the version of the answer the node
    holds, which stands (renewed); ``report``: send the full report now."""

    answer: int | None = None
    report: bool = False


def parse_lease_answer(body: bytes | str) -> Directives | LeaseAnswer:
    """A coordinator's answer to a lease: new directives (they have ``ttl_s``) or a
    ``LeaseAnswer``; ValueError names what is malformed."""
    doc = load_json(body)
    if isinstance(doc, dict) and "ttl_s" in doc:
        return Directives.from_json(doc)
    return decode(LeaseAnswer, doc)


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
