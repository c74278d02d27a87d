"""Agent configuration and per-model ``config.yaml`` parsing.

Both are YAML mappings checked against a small schema: an unknown key or a bad value is
a ``ConfigError`` naming the file and the dotted key, e.g.
``models/resnet/config.yaml: slo.latency_ms: must be a number > 0, got 'fast'``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from agent.validation import (ConfigError, boolean, check_config, choice, device, load_yaml,
                              number, size, str_list, string)

BACKENDS = ("onnx", "tfserving", "synthetic")
#: What a request for a model that is not loaded does: wait for the load (``serve``,
#: late answers count as SLO violations) or fail fast when the load outlasts its
#: deadline (``reject``: 503 + Retry-After while the load goes on in the background).
COLD_START = ("serve", "reject")


# The schemas below name the shared checkers (agent.validation) by short private names.
_bool, _choice, _device, _num = boolean, choice, device, number
_size, _str, _str_list = size, string, str_list


def gpu_budget(v: Any) -> int | dict[str, int]:
    """``gpu_budget``: one size for every GPU (``6GiB``), or sizes per device as a
    mapping (``{cuda:0: 6GiB}``) or a string (``cuda:0=6GiB,cuda:1=4GiB``)."""
    if isinstance(v, str) and "=" in v:
        pairs = [part.partition("=") for part in v.split(",")]
        if any(not sep for _, sep, _ in pairs):
            raise ValueError(f"must be a size or cuda:N=SIZE,... pairs, got {v!r}")
        v = {name.strip(): amount.strip() for name, _, amount in pairs}
    if isinstance(v, dict):
        if not v or any(_device(name) == "cpu" for name in v):
            raise ValueError(f"must name GPUs (cuda:N) with sizes, got {v!r}")
        return {_device(name): _size(amount) for name, amount in v.items()}
    return _size(v)


# -- per-model config.yaml -------------------------------------------------------------

_ORT_SCHEMA = {
    "intra_op_threads": _num(0, integer=True),
    "inter_op_threads": _num(0, integer=True),
    "graph_optimization_level": _choice("disable", "basic", "extended", "all"),
    "execution_mode": _choice("sequential", "parallel"),
    "allow_spinning": _bool,
    "enable_cpu_mem_arena": _bool,
    "enable_mem_pattern": _bool,
}
_SLO_SCHEMA = {"latency_ms": _num(0, strict_lo=True),
               "percentile": _num(0, 100, strict_lo=True)}
_BATCHING_SCHEMA = {
    "enabled": _bool,
    "adaptive": _bool,
    "window_ms_max": _num(0),
    "aimd_step": _num(1, integer=True),
    "budget_fraction": _num(0, 1, strict_lo=True),
    "workers": _num(1, 256, integer=True),
}
_PREDICTION_CACHE_SCHEMA = {"enabled": _bool, "max_bytes": _size}


def warmup_option(v: Any) -> "WarmupOptions":
    """``warmup``: ``default`` (one run on zeros shaped by the signature; a failure is
    logged and the model still loads), ``none``, ``{file: sample.json}`` (a v2 request
    body ``{"inputs": [...]}`` relative to the model directory) or ``{inputs: [...]}``
    (v2 inputs inline); a failing explicit sample fails the load."""
    if v in ("default", "none"):
        return WarmupOptions(v)
    if isinstance(v, dict) and len(v) == 1 and "file" in v:
        path = string(v["file"])
        if Path(path).is_absolute() or ".." in Path(path).parts:
            raise ValueError(f"file must be a path inside the model directory, got {path!r}")
        return WarmupOptions("file", file=path)
    if isinstance(v, dict) and len(v) == 1 and isinstance(v.get("inputs"), list) \
            and v["inputs"]:
        return WarmupOptions("inputs", inputs=tuple(v["inputs"]))
    raise ValueError("must be default, none, {file: PATH} or {inputs: [v2 inputs]}, "
                     f"got {v!r}")


_MODEL_SCHEMA = {
    "backend": _choice(*BACKENDS),
    "device": _device,
    "slo": _SLO_SCHEMA,
    "max_batch_size": _num(0, integer=True),
    "batching": _BATCHING_SCHEMA,
    "max_queue": _num(1, integer=True),
    "max_request_rows": _num(1, integer=True),
    "prediction_cache": _PREDICTION_CACHE_SCHEMA,
    "pin": _bool,
    "cold_start": _choice(*COLD_START),
    "load_wait_max_s": _num(0),
    "load_retry_s": _num(0),
    "idle_unload_s": _num(0, strict_lo=True),
    "onnxruntime": _ORT_SCHEMA,
    "warmup": warmup_option,
    "synthetic": {"base_ms": _num(0), "per_item_ms": _num(0), "size_bytes": _size,
                  "load_ms": _num(0)},
}


@dataclass(frozen=True)
class OrtOptions:
    """ONNX Runtime session options (``onnxruntime:`` in config.yaml)."""

    # One intra-op thread by default: the agent runs requests in parallel itself, and
    # spinning pools per session would fight over the few cores of an edge box.
    intra_op_threads: int = 1
    inter_op_threads: int = 1
    graph_optimization_level: str = "all"
    execution_mode: str = "sequential"
    allow_spinning: bool = False
    enable_cpu_mem_arena: bool = True
    enable_mem_pattern: bool = True


@dataclass(frozen=True)
class SyntheticOptions:
    """The synthetic backend's behaviour (``synthetic:`` in config.yaml)."""

    base_ms: float = 1.0
    per_item_ms: float = 0.0
    size_bytes: int = 1_000_000
    load_ms: float = 0.0


@dataclass(frozen=True)
class BatchingOptions:
    """Batching knobs (``batching:``). In a model's config.yaml a None field means "the
    server's value"; ``max_batch_size`` is the server default for models that do not set
    their own (a model sets it at the top level of its config.yaml)."""

    enabled: bool | None = None
    adaptive: bool | None = None        # False: a static limit (max_batch_size) and window
    window_ms_max: float | None = None  # longest wait for a batch to fill (0: never wait)
    aimd_step: int | None = None        # additive increase of the limit per full batch
    budget_fraction: float | None = None  # share of the SLO latency one batch may take
    workers: int | None = None          # workers (parallel batches) per model at load
    max_batch_size: int | None = None


SERVER_BATCHING = BatchingOptions(enabled=True, adaptive=True, window_ms_max=100.0,
                                  aimd_step=2, budget_fraction=0.5, workers=1,
                                  max_batch_size=32)


@dataclass(frozen=True)
class PredictionCacheOptions:
    """Per-model prediction cache (``prediction_cache:``); None fields: the server's."""

    enabled: bool | None = None
    max_bytes: int | None = None


SERVER_PREDICTION_CACHE = PredictionCacheOptions(enabled=False, max_bytes=64 * 2**20)


@dataclass(frozen=True)
class WarmupOptions:
    """How a model is warmed up before it is reported ready (``warmup:``)."""

    mode: str = "default"  # default | none | file | inputs
    file: str | None = None
    inputs: tuple[Any, ...] | None = None

    @property
    def explicit(self) -> bool:
        """A sample the user gave: its failure fails the load."""
        return self.mode in ("file", "inputs")


@dataclass(frozen=True)
class DeclaredTensor:
    """An input or output as a Triton ``config.pbtxt`` declares it: OIP datatype, full
    shape (the batch dimension included as -1 where the model batches)."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ModelConfig:
    """One model's settings; ``backend`` None means "infer it from the files"; None
    SLO, batch size and queue bound mean "the server's"."""

    backend: str | None = None
    device: str = "cpu"
    slo_latency_ms: float | None = None
    slo_percentile: float = 99.0
    max_batch_size: int | None = None  # 0 or 1: never batched
    batching: BatchingOptions = field(default_factory=BatchingOptions)
    max_queue: int | None = None
    max_request_rows: int | None = None  # rows per request; None: the server's
    prediction_cache: PredictionCacheOptions = field(default_factory=PredictionCacheOptions)
    pin: bool = False
    cold_start: str | None = None         # serve | reject; None: the server's
    load_wait_max_s: float | None = None  # longest wait for room; None: the server's
    load_retry_s: float | None = None  # a failed load is retried after; None: the server's
    idle_unload_s: float | None = None  # unload after this long unused; None: the server's
    onnxruntime: OrtOptions = field(default_factory=OrtOptions)
    synthetic: SyntheticOptions | None = None
    warmup: WarmupOptions | None = None  # None: the backend's default
    #: From a Triton config.pbtxt or a load's config override: the inputs/outputs it
    #: declares (checked against the model at load) and where they were said.
    declared_inputs: tuple[DeclaredTensor, ...] | None = None
    declared_outputs: tuple[DeclaredTensor, ...] | None = None
    declared_in: str | None = None


def parse_model_config(data: Any, file: str | Path | None = None) -> ModelConfig:
    """A ``ModelConfig`` from a parsed config.yaml mapping (errors name ``file``/key)."""
    d = check_config(data, _MODEL_SCHEMA, file)
    slo = d.get("slo", {})
    if slo and "latency_ms" not in slo:
        raise ConfigError(file, "slo.latency_ms", "required when slo is given")
    if "synthetic" in d and d.get("backend") != "synthetic":
        raise ConfigError(file, "synthetic", "only allowed with backend: synthetic")
    return ModelConfig(
        backend=d.get("backend"),
        device=d.get("device", "cpu"),
        slo_latency_ms=slo.get("latency_ms"),
        slo_percentile=slo.get("percentile", 99.0),
        max_batch_size=d.get("max_batch_size"),
        batching=BatchingOptions(**d.get("batching", {})),
        max_queue=d.get("max_queue"),
        max_request_rows=d.get("max_request_rows"),
        prediction_cache=PredictionCacheOptions(**d.get("prediction_cache", {})),
        pin=d.get("pin", False),
        cold_start=d.get("cold_start"),
        load_wait_max_s=d.get("load_wait_max_s"),
        load_retry_s=d.get("load_retry_s"),
        idle_unload_s=d.get("idle_unload_s"),
        onnxruntime=OrtOptions(**d.get("onnxruntime", {})),
        synthetic=SyntheticOptions(**d["synthetic"]) if d.get("backend") == "synthetic" else None,
        warmup=d.get("warmup"),
    )


def load_model_config(path: Path) -> ModelConfig:
    """Parse ``path`` (a model's config.yaml); a missing file gives the defaults."""
    if not path.exists():
        return ModelConfig()
    return parse_model_config(load_yaml(path), path)


# -- agent config ----------------------------------------------------------------------

_AGENT_SCHEMA = {
    "host": _str,
    "port": _num(0, 65535, integer=True),
    "grpc_port": _num(0, 65535, integer=True),
    "repository": _str,
    "data_dir": _str,
    "state_file": _str,
    "cpu_budget": _size,
    "gpu_budget": gpu_budget,
    "memory_margin": _num(0, 0.9),
    "policy": _str,
    "admin_token_file": _str,
    "max_request_size": _size,
    "max_request_bytes_in_flight": _size,
    "load_concurrency": _num(1, integer=True),
    "max_request_rows": _num(1, integer=True),
    "max_tensor_bytes": _size,
    "read_timeout_s": _num(0, strict_lo=True),
    "infer_threads": _num(1, integer=True),
    "restore": _bool,
    "drain_seconds": _num(0),
    "log_level": _choice("debug", "info", "warning", "error"),
    "slo": _SLO_SCHEMA,
    "batching": {**_BATCHING_SCHEMA, "max_batch_size": _num(0, integer=True)},
    "max_queue": _num(1, integer=True),
    "cold_start": _choice(*COLD_START),
    "load_wait_max_s": _num(0),
    "load_retry_s": _num(0),
    "idle_unload_s": _num(0, strict_lo=True),
    "prediction_cache": _PREDICTION_CACHE_SCHEMA,
    "tfserving": {
        "binary": _str, "address": _str, "grpc_port": _num(0, 65535, integer=True),
        "args": _str_list, "model_base_path": _str,
        "start_timeout_seconds": _num(0, strict_lo=True),
        "load_timeout_seconds": _num(0, strict_lo=True),
        "unload_timeout_seconds": _num(0, strict_lo=True),
        "request_timeout_seconds": _num(0, strict_lo=True),
        "restart_backoff_seconds": _num(0, strict_lo=True),
        "restart_backoff_max_seconds": _num(0, strict_lo=True),
    },
    "coordinator": {"url": _str, "report_interval_s": _num(0, strict_lo=True),
                    "token_file": _str, "node_name": _str, "cores": _num(0, strict_lo=True),
                    "node_type": _str},
}


def default_data_dir() -> Path:
    """``$EDGEAGENT_DATA_DIR``, systemd's ``$STATE_DIRECTORY``, or ~/.local/share/edgeagent."""
    for var in ("EDGEAGENT_DATA_DIR", "STATE_DIRECTORY"):
        if os.environ.get(var):
            return Path(os.environ[var].split(":")[0])
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "edgeagent"


@dataclass(frozen=True)
class CoordinatorLink:
    """Where and how often the agent reports (``coordinator:``); ``cores`` None means
    the CPUs this process may use, ``node_name`` None the host name."""

    url: str
    report_interval_s: float = 5.0
    token_file: Path | None = None
    node_name: str | None = None
    cores: float | None = None
    node_type: str | None = None  # a key of the coordinator's node_types price table


@dataclass(frozen=True)
class TfServingSettings:
    """How the agent reaches TensorFlow Serving (``tfserving:``). Managed (default): the
    agent runs ``binary`` (a path or a command, split like a shell would) with ``args``;
    attach: ``address`` (host:port) names a server someone else runs, ``binary`` unused."""

    binary: str = "tensorflow_model_server"
    address: str | None = None
    grpc_port: int = 0  # managed: 0 = a free port, chosen at each start
    args: tuple[str, ...] = ()
    model_base_path: str | None = None  # the repository root as the server sees it
    start_timeout_seconds: float = 60.0
    load_timeout_seconds: float = 120.0
    unload_timeout_seconds: float = 60.0
    request_timeout_seconds: float = 60.0
    restart_backoff_seconds: float = 1.0  # doubles per failed restart, up to the max
    restart_backoff_max_seconds: float = 30.0


@dataclass(frozen=True)
class AgentConfig:
    """The node agent's settings. None budgets mean "from psutil / NVML minus a margin"."""

    host: str = "127.0.0.1"
    port: int = 8000
    grpc_port: int = 8001  # KServe v2 gRPC (Triton's port); 0: no gRPC endpoint
    repository: Path | None = None
    data_dir: Path = field(default_factory=default_data_dir)
    state_file: Path | None = None
    cpu_budget: int | None = None
    gpu_budget: int | dict[str, int] | None = None  # one size for all GPUs, or per cuda:N
    memory_margin: float = 0.2
    policy: str = "cremebrulee"
    admin_token_file: Path | None = None
    max_request_size: int = 64 * 2**20
    max_request_bytes_in_flight: int = 256 * 2**20  # request bodies read and not answered
    load_concurrency: int = 1  # loads at once: each holds its peak; windows measure cleanly
    infer_threads: int = max(2, os.cpu_count() or 2)
    # Rows per request; None: REQUEST_ROWS_FACTOR x the model's max_batch_size, at
    # least MIN_REQUEST_ROWS (agent.node.serving.resolve_settings).
    max_request_rows: int | None = None
    max_tensor_bytes: int = 256 * 2**20  # decoded input tensors of one request, in all
    read_timeout_s: float = 30.0  # a request's headers, then its body, must arrive within
    restore: bool = True
    drain_seconds: float = 30.0
    log_level: str = "info"
    # Defaults for models whose config.yaml does not say (see ModelConfig).
    slo_latency_ms: float = 1000.0
    slo_percentile: float = 99.0
    batching: BatchingOptions = SERVER_BATCHING
    max_queue: int = 50  # tail drop bound per model queue (Faro)
    cold_start: str = "serve"     # see COLD_START
    load_wait_max_s: float = 30.0  # a load waits this long for room, then 503
    load_retry_s: float = 30.0  # a failed load answers 503 this long before a new try
    idle_unload_s: float | None = None  # unload a model unused this long; None: never
    prediction_cache: PredictionCacheOptions = SERVER_PREDICTION_CACHE
    tfserving: TfServingSettings = field(default_factory=TfServingSettings)
    coordinator: CoordinatorLink | None = None  # None: run stand-alone, report nowhere
    source: Path | None = None  # the file it came from, for SIGHUP reloads

    @property
    def resident_state_path(self) -> Path:
        return self.state_file or self.data_dir / "resident.json"

    @property
    def footprints_path(self) -> Path:
        """Where learned footprint factors are kept across restarts."""
        return self.data_dir / "footprints.json"

    def with_overrides(self, **changes: Any) -> "AgentConfig":
        """A copy with the non-None ``changes`` applied (command-line flags)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


_PATH_KEYS = {"repository", "data_dir", "state_file", "admin_token_file"}


def parse_agent_config(data: Any, file: str | Path | None = None) -> AgentConfig:
    """An ``AgentConfig`` from a parsed YAML mapping; relative paths are from ``file``'s dir."""
    d = check_config(data, _AGENT_SCHEMA, file)
    base = Path(file).parent if file else Path.cwd()
    for key in _PATH_KEYS & d.keys():
        d[key] = (base / Path(d[key]).expanduser()).resolve()
    if "policy" in d:
        from cachepolicies.registry import parse_policy_spec

        try:
            parse_policy_spec(d["policy"])
        except ValueError as exc:
            raise ConfigError(file, "policy", str(exc)) from None
    if "coordinator" in d:
        link = d["coordinator"]
        if "url" not in link:
            raise ConfigError(file, "coordinator.url", "required when coordinator is given")
        if not link["url"].startswith(("http://", "https://")):
            raise ConfigError(file, "coordinator.url",
                              f"must be an http:// or https:// URL, got {link['url']!r}")
        if "token_file" in link:
            link["token_file"] = (base / Path(link["token_file"]).expanduser()).resolve()
        d["coordinator"] = CoordinatorLink(**link)
    if "tfserving" in d:
        tfs = d["tfserving"]
        if "address" in tfs and "binary" in tfs:
            raise ConfigError(file, "tfserving.address",
                              "give binary (the agent runs the server) or address (attach "
                              "to a running one), not both")
        if "address" in tfs and not tfs["address"].rpartition(":")[2].isdigit():
            raise ConfigError(file, "tfserving.address",
                              f"must be host:port, got {tfs['address']!r}")
        d["tfserving"] = TfServingSettings(**tfs)
    if "slo" in d:
        slo = d.pop("slo")
        if "latency_ms" in slo:
            d["slo_latency_ms"] = slo["latency_ms"]
        if "percentile" in slo:
            d["slo_percentile"] = slo["percentile"]
    if "batching" in d:
        d["batching"] = replace(SERVER_BATCHING, **d["batching"])
    if "prediction_cache" in d:
        d["prediction_cache"] = replace(SERVER_PREDICTION_CACHE, **d["prediction_cache"])
    known = {f.name for f in fields(AgentConfig)}
    assert set(d) <= known
    return AgentConfig(**d, source=Path(file) if file else None)


def load_agent_config(path: str | Path) -> AgentConfig:
    path = Path(path)
    return parse_agent_config(load_yaml(path), path)
