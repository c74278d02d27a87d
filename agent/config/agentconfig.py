"""The agent's configuration (``AgentConfig``: the node agent's YAML file, its
coordinator link and TF Serving settings), declared once like a model's
(``agent.config.modelconfig``): the parser, the defaults, the documented example file
(``configs/agent.yaml``) and the help of ``edgeagent serve``'s flags all come from it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

from msgspec import field, structs

from agent.config.modelconfig import (COLD_START, SERVER_BATCHING, SERVER_PREDICTION_CACHE,
                                      PredictionCacheOptions, ServerBatching, SloOptions)
from agent.schema import (AtLeastOne, AtLeastZero, LogLevel, MaxConnections,
                          MaxConnectionsPerPeer, NonNegative, Port, Positive, Section, Text,
                          load, setting)
from agent.security.authconfig import AgentAuthSettings
from agent.security.tls import TlsSettings
from agent.validation import ConfigError, choice, device, load_yaml, size, string

#: The node's name where the config gives none (``AgentConfig.node_name``).
NODE_NAME_VARIABLE = "EDGEAGENT_NODE_NAME"


def gpu_budget(v: Any) -> int | dict[str, int]:
    """``gpu_budget``: one size for every GPU (``6GiB``), or sizes per device as a
    mapping (``{cuda:0: 6GiB}``) or a string (``cuda:0=6GiB,cuda:1=4GiB``)."""
    if isinstance(v, str) and "=" in v:
        pairs = [part.partition("=") for part in v.split(",")]
        if any(not sep for _, sep, _ in pairs):
            raise ValueError(f"must be a size or cuda:N=SIZE,... pairs, got {v!r}")
        v = {name.strip(): amount.strip() for name, _, amount in pairs}
    if isinstance(v, dict):
        if not v or any(device(name) == "cpu" for name in v):
            raise ValueError(f"must name GPUs (cuda:N) with sizes, got {v!r}")
        return {device(name): size(amount) for name, amount in v.items()}
    return size(v)


def http_url(v: Any) -> str:
    if not string(v).startswith(("http://", "https://")):
        raise ValueError(f"must be an http:// or https:// URL, got {v!r}")
    return v


def host_port(v: Any) -> str:
    if not string(v).rpartition(":")[2].isdigit():
        raise ValueError(f"must be host:port, got {v!r}")
    return v


def default_data_dir() -> Path:
    """``$EDGEAGENT_DATA_DIR``, systemd's ``$STATE_DIRECTORY``, or ~/.local/share/edgeagent."""
    for var in ("EDGEAGENT_DATA_DIR", "STATE_DIRECTORY"):
        if os.environ.get(var):
            return Path(os.environ[var].split(":")[0])
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "edgeagent"


class CoordinatorLink(Section):
    """Where and how often the agent reports (``coordinator:``)."""

    url: Annotated[str, setting("the coordinator's URL", check=http_url,
                                example="http://10.0.0.5:8100")]
    report_interval_s: Annotated[Positive, setting(
        "seconds between reports: a full report, or a lease renewed where the "
        "coordinator takes leases and nothing the planner uses changed")] = 5.0
    full_report_s: Annotated[Positive, setting(
        "the longest between two full reports (the arrivals counted meanwhile go with "
        "the next one); set it to report_interval_s for a full report every time")] = 300.0
    change_threshold: Annotated[float, setting(
        "a model's arrivals or 503s over the last minute that moved by more than this "
        "share of what the last full report's rate predicts (and past Poisson noise), "
        "its size by more, or a latency percentile by more than twice it, send a full "
        "report before full_report_s", gt=0, le=10)] = 0.25
    token_file: Annotated[Path | None, setting(
        "file holding the bearer token reports carry: this node's report token (or the "
        "coordinator's admin token)", example="/etc/edgeagent/coordinator-token")] = None
    join_token_file: Annotated[Path | None, setting(
        "file holding a one-time join token (edgeagent token join): the agent trades it "
        "once for its own node credential, written to credential_file",
        example="/etc/edgeagent/join-token")] = None
    credential_file: Annotated[Path | None, setting(
        "where the node credential obtained with join_token_file is kept (mode 0600); "
        "reports carry it once it exists", example="/var/lib/edgeagent/node-token")] = None
    node_name: Annotated[Text | None, setting(
        "this node's name; left out: $EDGEAGENT_NODE_NAME, else the host name",
        example="edge-1")] = None
    cores: Annotated[Positive | None, setting(
        "cores this node offers the planner; left out: the CPUs this process may use",
        example=4)] = None
    node_type: Annotated[Text | None, setting(
        "the kind of machine, a key of the coordinator's node_types price table (fleet "
        "sizing and provisioning)", example="c5.2xlarge")] = None
    ca_file: Annotated[Path | None, setting(
        "CA certificates (PEM) an https:// coordinator's certificate must chain to; left "
        "out: the system's", example="/etc/edgeagent/tls/fleet-ca.crt")] = None
    cert_file: Annotated[Path | None, setting(
        "this node's client certificate (PEM) for a coordinator that asks for one",
        example="/etc/edgeagent/tls/node.crt")] = None
    key_file: Annotated[Path | None, setting(
        "its private key (PEM)", example="/etc/edgeagent/tls/node.key")] = None
    advertise_url: Annotated[str | None, setting(
        "where the other nodes reach this one over HTTP (sent in reports; the routing "
        "table names it); left out: http(s)://host:port as the agent listens (the "
        "machine's name for host 0.0.0.0)", check=http_url,
        example="https://10.0.0.7:8000")] = None
    advertise_grpc: Annotated[str | None, setting(
        "where the other nodes reach this one over gRPC (host:port); left out: "
        "advertise_url's host and grpc_port (none when grpc_port is 0)",
        check=host_port, example="10.0.0.7:8001")] = None


class RoutingSettings(Section):
    """The fleet as one cache (``routing:``): a request for a model the plan runs on
    other nodes is forwarded to one of them, one hop at most (docs/coordinator.md)."""

    enabled: Annotated[bool | None, setting(
        "forward requests by the coordinator's routing table; left out: on when the "
        "agent reports to a coordinator, off when it runs alone", example=True,
        commented=True)] = None
    max_table_age_s: Annotated[Positive, setting(
        "a routing table not confirmed by the coordinator for this long (or for its "
        "own max_age_s, the shorter) is no longer trusted: every request is served "
        "here")] = 60.0
    peer_timeout_ms: Annotated[Positive, setting(
        "a peer must accept the connection within this, and answer within the "
        "request's SLO plus this (the client's own timeout when it sets one); else "
        "the request is served here and the peer skipped for a while")] = 2000.0
    peer_backoff_s: Annotated[Positive, setting(
        "a peer that failed is skipped this long, doubling while it keeps failing")] \
        = 1.0
    peer_backoff_max_s: Annotated[Positive, setting(
        "the longest a failing peer is skipped before it is tried again")] = 30.0
    connections_per_peer: Annotated[AtLeastOne, setting(
        "kept-alive connections to each peer (more requests wait for one)")] = 32
    token_file: Annotated[Path | None, setting(
        "file holding the bearer token this node forwards with (a token with scope "
        "peer in the other nodes' auth.token_file); the client's own credentials are "
        "never passed on", example="/etc/edgeagent/peer-token")] = None
    ca_file: Annotated[Path | None, setting(
        "CA certificates (PEM) https:// peers' certificates must chain to; left out: "
        "coordinator.ca_file, else the system's", example="/etc/edgeagent/tls/fleet-ca.crt")] \
        = None
    cert_file: Annotated[Path | None, setting(
        "this node's client certificate (PEM) for peers that check them; left out: "
        "coordinator.cert_file", example="/etc/edgeagent/tls/node.crt")] = None
    key_file: Annotated[Path | None, setting(
        "its private key (PEM); left out: coordinator.key_file",
        example="/etc/edgeagent/tls/node.key")] = None


#: The OTLP protocols a trace exporter speaks (``tracing.protocol``), as OpenTelemetry
#: names them (``OTEL_EXPORTER_OTLP_PROTOCOL``).
OTLP_PROTOCOLS = ("grpc", "http/protobuf")


class TracingSettings(Section):
    """OpenTelemetry traces of inference requests (``tracing:``), sent to an OTLP
    collector; needs the tracing extra (docs/operations.md#traces)."""

    endpoint: Annotated[str | None, setting(
        "the OTLP collector's URL; left out: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or "
        "$OTEL_EXPORTER_OTLP_ENDPOINT, else http://localhost:4317 (grpc) or "
        "http://localhost:4318/v1/traces (http/protobuf)", check=http_url,
        example="http://127.0.0.1:4317")] = None
    protocol: Annotated[str, setting(
        "how spans are sent: grpc or http/protobuf (the collector's path /v1/traces in "
        "the endpoint)", check=choice(*OTLP_PROTOCOLS))] = "grpc"
    sample_ratio: Annotated[float, setting(
        "share of requests traced, by trace id; a request whose traceparent says "
        "sampled (or not) follows its caller", ge=0, le=1)] = 1.0
    service_name: Annotated[Text, setting(
        "service.name of the spans (service.instance.id is the node's name)")] = \
        "edgeagent"


class TfServingSettings(Section):
    """How the agent reaches TensorFlow Serving (``tfserving:``)."""

    binary: Annotated[Text, setting(
        "the server the agent runs: a path or a command line (split as a shell "
        "would)")] = "tensorflow_model_server"
    address: Annotated[str | None, setting(
        "attach to a server someone else runs (host:port) instead of running binary",
        check=host_port, example="127.0.0.1:8500", commented=True)] = None
    grpc_port: Annotated[Port, setting(
        "the managed server's gRPC port; 0: a free port at each start")] = 0
    args: Annotated[tuple[Text, ...], setting(
        "more arguments for the managed server",
        example=["--tensorflow_intra_op_parallelism=2"])] = ()
    model_base_path: Annotated[Text | None, setting(
        "the repository root as that server sees it", example="/models")] = None
    start_timeout_seconds: Annotated[Positive, setting(
        "the managed server must serve within this of its start")] = 60.0
    load_timeout_seconds: Annotated[Positive, setting("a model's load must end within "
                                                      "this")] = 120.0
    unload_timeout_seconds: Annotated[Positive, setting("a model's unload must end within "
                                                        "this")] = 60.0
    request_timeout_seconds: Annotated[Positive, setting("a request to the server must "
                                                         "end within this")] = 60.0
    restart_backoff_seconds: Annotated[Positive, setting(
        "wait before restarting a managed server that died; doubles while it keeps "
        "dying, up to the max")] = 1.0
    restart_backoff_max_seconds: Annotated[Positive, setting(
        "the longest wait before a restart")] = 30.0


class AgentConfig(Section):
    """The node agent's settings (edgeagent serve --config FILE). Every key is optional;
    command-line flags override these values. An unknown key is an error naming the file
    and the key. Relative paths are resolved from the file's directory. Sizes take bytes
    or units: 512MB, 2GiB."""

    host: Annotated[Text, setting(
        "address to listen on (0.0.0.0 for all interfaces: then tls and admin_token_file, "
        "or insecure)")] = "127.0.0.1"
    port: Annotated[Port, setting(
        "HTTP port: KServe v2 and TF Serving REST, cache admin, /metrics")] = 8000
    tls: Annotated[TlsSettings | None, setting(
        "TLS on the HTTP and gRPC ports (re-read on SIGHUP); left out: plain text")] = None
    insecure: Annotated[bool, setting(
        "listen on a non-loopback host without tls and admin_token_file")] = False
    grpc_port: Annotated[Port, setting(
        "KServe v2 gRPC port (tritonclient.grpc), as Triton's; 0: no gRPC endpoint")] = 8001
    repository: Annotated[Path | None, setting(
        "model repository: <repository>/<model>/<version>/model.onnx, and a config.yaml "
        "per model; left out: the generated demo", example="/var/lib/edgeagent/models",
        commented=False)] = None
    data_dir: Annotated[Path, setting(
        "warm-restart state, learned footprint factors and the demo models; left out: "
        "$EDGEAGENT_DATA_DIR, $STATE_DIRECTORY or ~/.local/share/edgeagent",
        example="/var/lib/edgeagent", commented=True)] = field(default_factory=default_data_dir)
    state_file: Annotated[Path | None, setting(
        "the resident set kept across restarts; left out: resident.json in data_dir",
        example="/var/lib/edgeagent/resident.json")] = None
    cpu_budget: Annotated[int | None, setting(
        "CPU memory for models; left out: the memory available at start minus "
        "memory_margin (keep systemd's MemoryMax above it)", check=size, example="2GiB",
        commented=False)] = None
    gpu_budget: Annotated[int | dict[str, int] | None, setting(
        "GPU memory for models: one size for every GPU (6GiB) or per device "
        "(cuda:0=6GiB,cuda:1=4GiB, or a mapping); the CUDA context is taken off it; left "
        "out: each GPU's memory (NVML) minus memory_margin", check=gpu_budget,
        example="12GiB")] = None
    memory_margin: Annotated[float, setting(
        "share of memory left out of a budget the agent measures itself", ge=0, le=0.9)] \
        = 0.2
    policy: Annotated[Text, setting(
        "eviction policy: a name (edgeagent simulate --help lists them) and :k=v "
        "parameters")] = "cremebrulee-forecast"
    allowed_hosts: Annotated[tuple[Text, ...], setting(
        "requests without a token must name the agent in Host (and Origin): an IP "
        "address, localhost, host, this machine's name, or one of these (a DNS "
        "rebinding guard); others get 403", example=["edge-1.example.net"])] = ()
    admin_token_file: Annotated[Path | None, setting(
        "file holding the bearer token (scope admin) that the admin and repository "
        "endpoints (/v1/cache, /v2/repository) then require, and inference and "
        "statistics too (auth.protect)", example="/etc/edgeagent/admin-token")] \
        = None
    max_request_size: Annotated[int, setting(
        "largest request body; larger ones get 413", check=size, example="64MiB")] \
        = 64 * 2**20
    max_request_bytes_in_flight: Annotated[int, setting(
        "request bodies read and not yet answered, in all; a body that does not fit "
        "waits for room, then 503", check=size, example="256MiB")] = 256 * 2**20
    grpc_max_concurrent_rpcs: Annotated[AtLeastOne, setting(
        "gRPC calls served at once; more get RESOURCE_EXHAUSTED. A ModelInfer message "
        "is received only once 3 x max_request_size (what grpcio holds while it hands "
        "a message over; at most the whole limit) is free in "
        "max_request_bytes_in_flight; until then its call holds 64 KiB")] = 64
    record_requests: Annotated[AtLeastZero, setting(
        "requests the agent remembers for its twin (GET /v1/trace, edgeagent simulate "
        "--from): a ring of 22 bytes a request, allocated at start, the oldest "
        "overwritten; nothing on disk; 0: none")] = 100_000
    load_concurrency: Annotated[AtLeastOne, setting(
        "models loading at once, each reserving its peak from the budget (one: loads "
        "measure cleanly); raise it where loads wait on I/O (TF Serving, remote disks)")] = 1
    infer_threads: Annotated[AtLeastOne, setting(
        "threads running inference; left out: the CPU count, at least 2", example=4,
        commented=True)] = max(2, os.cpu_count() or 2)
    max_request_rows: Annotated[AtLeastOne | None, setting(
        "rows per request (a model's config.yaml may set its own); more get 413; left "
        "out: 64 x the model's max_batch_size, at least 1024", example=2048)] = None
    max_tensor_bytes: Annotated[int, setting(
        "a request's input tensors, decoded, in all; more get 413", check=size,
        example="256MiB")] = 256 * 2**20
    read_timeout_s: Annotated[Positive, setting(
        "a TLS handshake must end within this of connecting, a request's headers within "
        "this of the connection (or of the last answer: idle keep-alive connections close "
        "too), its body within this of its headers (else 408)")] = 30.0
    max_connections: MaxConnections = None
    max_connections_per_peer: MaxConnectionsPerPeer = None
    restore: Annotated[bool, setting(
        "reload the last resident set on start, most popular first")] = True
    drain_seconds: Annotated[NonNegative, setting(
        "on SIGTERM, how long requests in flight may finish")] = 30.0
    log_level: LogLevel = "info"
    slo: Annotated[SloOptions, setting(
        "the latency SLO of models whose config.yaml has none")] = SloOptions(1000.0)
    batching: Annotated[ServerBatching, setting(
        "batching of models whose config.yaml does not say")] = SERVER_BATCHING
    max_queue: Annotated[AtLeastOne, setting(
        "tail drop: a model queue this long rejects new requests (503)")] = 50
    cold_start: Annotated[str, setting(
        "a request for a model not loaded: serve (wait for the load; late answers count "
        "as SLO violations) or reject (503 + Retry-After when the load outlasts the "
        "request's deadline; the load goes on)", check=choice(*COLD_START))] = "serve"
    load_wait_max_s: Annotated[NonNegative, setting(
        "a load waits this long for room, then 503")] = 30.0
    load_retry_s: Annotated[NonNegative, setting(
        "after a failed load, requests get 503 this long before a new try")] = 30.0
    idle_unload_s: Annotated[Positive | None, setting(
        "unload a model unused this long (a model may set its own); left out: never",
        example=600)] = None
    prediction_cache: Annotated[PredictionCacheOptions, setting(
        "prediction caches of models whose config.yaml does not say")] = \
        SERVER_PREDICTION_CACHE
    # -- models that travel: the disk tier (data_dir/models) --
    disk_budget: Annotated[int | None, setting(
        "bytes the files of pulled models (config.yaml source:) may take under "
        "data_dir/models; left out: half the file system's free space at start (what "
        "the tier holds counted as free)", check=size, example="20GiB")] = None
    disk_policy: Annotated[Text | None, setting(
        "eviction policy of the disk tier (penalty: a model's measured download "
        "seconds); left out: policy", example="gdsf")] = None
    max_concurrent_pulls: Annotated[AtLeastOne, setting(
        "models downloading at once; more wait for a turn")] = 2
    pull_bandwidth: Annotated[int | None, setting(
        "bytes per second each pull may take; left out: no cap", check=size,
        example="50MB")] = None
    source_poll_s: Annotated[Positive | None, setting(
        "list the sources of sourced models this often: a new version found there is "
        "pulled and rolled out (loaded beside the old one, switched once ready); left "
        "out: only at start, on a rescan and on a coordinator's pull", example=300)] = None
    tfserving: Annotated[TfServingSettings, setting(
        "TensorFlow Serving, for SavedModels in the repository (pip install "
        "'edgeagent[tfserving]'). Managed (default): the agent runs binary with an empty "
        "model list and restarts it with backoff when it dies. Attach: give address "
        "instead of binary", commented=True)] = field(default_factory=TfServingSettings)
    auth: Annotated[AgentAuthSettings, setting(
        "scoped tokens (admin, read, infer) and the endpoint groups they guard")] = \
        field(default_factory=AgentAuthSettings)
    coordinator: Annotated[CoordinatorLink | None, setting(
        "report to a fleet coordinator (edgeagent coordinator serve) and take its "
        "directives; left out: run stand-alone")] = None
    routing: Annotated[RoutingSettings, setting(
        "forward requests to the nodes the coordinator's plan runs their model on")] = \
        field(default_factory=RoutingSettings)
    tracing: Annotated[TracingSettings | None, setting(
        "OpenTelemetry traces of inference requests (admission, queue, download, load, "
        "first run, batch) to an OTLP collector; left out: none, at no cost")] = None

    @property
    def resident_state_path(self) -> Path:
        return self.state_file or self.data_dir / "resident.json"

    @property
    def models_dir(self) -> Path:
        """Where the disk tier keeps pulled models: ``<name>/<version>/``."""
        return self.data_dir / "models"

    @property
    def assigned_dir(self) -> Path:
        """The model directories the coordinator's pull directives write (a second
        repository root: the operator's own entry wins a name clash)."""
        return self.data_dir / "assigned"

    @property
    def node_name(self) -> str:
        """This node's name in the fleet: ``coordinator.node_name``, else
        ``$EDGEAGENT_NODE_NAME`` (Kubernetes: the downward API's spec.nodeName; a pod's
        host name is the pod's, new at every restart), else the host's."""
        link = self.coordinator
        if link is not None and link.node_name:
            return link.node_name
        return os.environ.get(NODE_NAME_VARIABLE) or os.uname().nodename

    @property
    def routes(self) -> bool:
        """Whether the agent forwards by a routing table: ``routing.enabled``, or when
        left out, whether it reports to a coordinator."""
        enabled = self.routing.enabled
        return self.coordinator is not None if enabled is None else enabled

    @property
    def footprints_path(self) -> Path:
        """Where learned footprint factors are kept across restarts."""
        return self.data_dir / "footprints.json"

    def with_overrides(self, **changes: Any) -> AgentConfig:
        """A copy with the non-None ``changes`` applied (command-line flags)."""
        return structs.replace(self, **{k: v for k, v in changes.items() if v is not None})


def parse_agent_config(data: Any, file: str | Path | None = None) -> AgentConfig:
    """An ``AgentConfig`` from a parsed YAML mapping; relative paths are from ``file``'s
    directory."""
    config = load(AgentConfig, data, file)
    tfserving = data.get("tfserving") if isinstance(data, dict) else None
    if isinstance(tfserving, dict) and "address" in tfserving and "binary" in tfserving:
        raise ConfigError(file, "tfserving.address", "give binary (the agent runs the "
                          "server) or address (attach to a running one), not both")
    for key in ("policy", "disk_policy"):
        if isinstance(data, dict) and data.get(key) is not None:
            from cachepolicies.registry import parse_policy_spec

            try:
                parse_policy_spec(getattr(config, key))
            except ValueError as exc:
                raise ConfigError(file, key, str(exc)) from None
    return config


def load_agent_config(path: str | Path) -> AgentConfig:
    path = Path(path)
    return parse_agent_config(load_yaml(path), path)
