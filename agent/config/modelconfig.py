"""A model's ``config.yaml``, declared once (its sections and ``ModelConfig``), with
the checkers of what a type cannot say (a source URL, a digest, source options).

Every key is a field of a frozen msgspec Struct whose annotation carries its type,
bounds and help (``agent.schema.setting``); the parser, the defaults and the
documented example file (``configs/model.yaml``: ``edgeagent config example``) all come
from it. An unknown key or a bad value is a ``ConfigError`` naming the file and the
dotted key, e.g. ``models/resnet/config.yaml: slo.latency_ms: must be a number > 0,
got 'fast'``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

from msgspec import Meta, field

from agent.schema import (INTERNAL, AtLeastOne, AtLeastZero, NonNegative, Positive,
                          Section, Text, load, setting)
from agent.validation import ConfigError, SchemaError, choice, device, load_yaml, size, string

BACKENDS = ("onnx", "tfserving", "synthetic")
#: A model's ``backend:``: a runtime, or ``selection`` (an app over other models).
MODEL_BACKENDS = (*BACKENDS, "selection")
#: A selection app's policies (``agent.node.selection.policies``); clipper_exp4 is the
#: paper's literal update, kept as a control.
SELECTION_POLICIES = ("exp3", "exp4", "epsilon_greedy", "thompson", "static", "clipper_exp4")
#: What an app's output is: class ids (INT64 [N, 1]), scores (FP32 [N, C]) or values.
OUTPUT_KINDS = ("label", "scores", "value")
#: What a request for a model that is not loaded does: wait for the load (``serve``,
#: late answers count as SLO violations) or fail fast when the load outlasts its
#: deadline (``reject``: 503 + Retry-After while the load goes on in the background).
COLD_START = ("serve", "reject")


#: The URL schemes a model's ``source`` may name (``agent.sources`` opens them).
SOURCE_SCHEMES = ("s3", "oci", "https", "http", "file")


def source_url(v: Any) -> str:
    """``source``: a URL whose scheme ``agent.sources`` opens; the message never echoes
    the URL (it may carry credentials)."""
    scheme, sep, rest = (v if isinstance(v, str) else "").partition("://")
    if not sep or not rest:
        raise ValueError(f"must be a URL such as s3://bucket/prefix ({', '.join(SOURCE_SCHEMES)})")
    if scheme.lower() not in SOURCE_SCHEMES:
        raise ValueError(f"scheme {scheme[:16]!r} is none of {', '.join(SOURCE_SCHEMES)}")
    return v


#: A version's digest as ``digest:`` and the coordinator's catalog write it.
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}\Z")


def version_digest(v: Any) -> str:
    """``digest``: ``sha256:<64 lowercase hex>``, the digest of one whole version (what a
    pull reports: ``agent.sources.PullResult.digest``)."""
    if not isinstance(v, str) or not _DIGEST.match(v):
        raise ValueError(f"must be sha256:<64 lowercase hex digits>, got {str(v)[:80]!r}")
    return v


def source_options(v: Any) -> dict[str, Any]:
    """``source_options``: a mapping of option names to scalars (``endpoint_url``,
    ``sha256``, ...); which names a scheme takes is its source's to say."""
    if not isinstance(v, dict) or not all(isinstance(k, str) and k for k in v):
        raise ValueError("must be a mapping of option names to values")
    bad = [k for k, x in v.items() if not isinstance(x, (str, int, float, bool))]
    if bad:
        raise ValueError(f"{bad[0]}: must be a string, number or boolean")
    return dict(v)


# -- a model's config.yaml --------------------------------------------------------------


class OrtOptions(Section):
    """ONNX Runtime session options (``onnxruntime:`` in config.yaml)."""

    intra_op_threads: Annotated[AtLeastZero, setting(
        "threads within one operator (0: ONNX Runtime's choice); one, as the agent runs "
        "requests in parallel itself and spinning pools per session would fight over the "
        "few cores of an edge box")] = 1
    inter_op_threads: Annotated[AtLeastZero, setting(
        "threads across operators (execution_mode: parallel)")] = 1
    graph_optimization_level: Annotated[str, setting(
        "graph optimizations applied at load",
        check=choice("disable", "basic", "extended", "all"))] = "all"
    execution_mode: Annotated[str, setting(
        "run independent operators one after another or in parallel",
        check=choice("sequential", "parallel"))] = "sequential"
    allow_spinning: Annotated[bool, setting(
        "let idle threads spin (a faster wake-up for a core kept busy)")] = False
    enable_cpu_mem_arena: Annotated[bool, setting("ONNX Runtime's CPU memory arena")] = True
    enable_mem_pattern: Annotated[bool, setting("ONNX Runtime's memory pattern planning")] \
        = True


class ErrorSpan(Section, array_like=True):
    """Rows whose id is in [from_row, to_row) answer wrong at ``rate`` (a failure)."""

    from_row: Annotated[AtLeastZero, setting("first row id")]
    to_row: Annotated[AtLeastZero, setting("row id after the last")]
    rate: Annotated[float, setting("error rate", ge=0, le=1)]


class ClassifierOptions(Section):
    """The synthetic classifier (``synthetic.classifier``): input X FP32 [N, 3] = (row id,
    true label, group), output Y INT64 [N, 1]; wrong on a deterministic subset of rows."""

    classes: Annotated[int, setting("number of classes", ge=2)] = 10
    seed: Annotated[int, setting("seed of the rows it gets wrong (with the model name)")] = 1
    error: Annotated[float, setting("error rate of rows neither listed below", ge=0,
                                    le=1)] = 0.1
    schedule: Annotated[tuple[ErrorSpan, ...], setting(
        "[from_row, to_row, rate] spans of row ids with their own error rate",
        example=[[5000, 10000, 0.9]])] = ()
    groups: Annotated[dict[int, Annotated[float, Meta(ge=0, le=1)]], setting(
        "error rate by group (the third input column)", example={3: 0.15})] = \
        field(default_factory=dict)
    scores: Annotated[bool, setting("also answer SCORES FP32 [N, classes]")] = False


class JitterOptions(Section):
    """Random latency on top of ``base_ms`` (``synthetic.jitter``): stragglers."""

    lognormal_sigma: Annotated[NonNegative, setting(
        "base_ms is scaled by exp(sigma × a standard normal)")] = 0.0
    outlier_p: Annotated[float, setting("chance a batch takes outlier_ms more", ge=0,
                                        le=1)] = 0.0
    outlier_ms: Annotated[NonNegative, setting("an outlier's extra ms")] = 0.0


class SyntheticOptions(Section):
    """The synthetic backend's behaviour (``synthetic:`` in config.yaml)."""

    base_ms: Annotated[NonNegative, setting("ms per batch")] = 1.0
    per_item_ms: Annotated[NonNegative, setting("ms per row of a batch, added")] = 0.0
    size_bytes: Annotated[int, setting("memory the model takes (bytes or a size such as "
                                       "512MB)", check=size, example="1MB")] = 1_000_000
    load_ms: Annotated[NonNegative, setting("ms a load takes")] = 0.0
    classifier: Annotated[ClassifierOptions | None, setting(
        "answer as a classifier (tests and benches of selection apps)")] = None
    jitter: Annotated[JitterOptions | None, setting("random latency (stragglers)")] = None


class SloOptions(Section):
    """A latency SLO: the deadline and the percentile of requests that must meet it."""

    latency_ms: Annotated[Positive, setting(
        "a request's deadline in ms (a client's timeout parameter, in microseconds as "
        "tritonclient sends it, may make it tighter)", example=100)]
    percentile: Annotated[float, setting("the percentile of requests the deadline holds for",
                                         gt=0, le=100)] = 99.0


class BatchingOptions(Section):
    """Batching knobs (``batching:``). In a model's config.yaml a None field means "the
    agent's value"."""

    enabled: Annotated[bool | None, setting(
        "batch requests (models whose inputs and outputs all have a variable first "
        "dimension)", example=True)] = None
    adaptive: Annotated[bool | None, setting(
        "an AIMD limit on the batch size and MArk's window; false: the static "
        "max_batch_size and window_ms_max", example=True)] = None
    window_ms_max: Annotated[NonNegative | None, setting(
        "longest wait for a batch to fill (0: never delay a batch)", example=100)] = None
    aimd_step: Annotated[AtLeastOne | None, setting(
        "+rows of the limit per full batch within budget (-10 % when a batch is over it)",
        example=2)] = None
    budget_fraction: Annotated[Annotated[float, Meta(gt=0, le=1)] | None, setting(
        "share of the SLO latency one batch may take (the rest: waiting behind one)",
        example=0.5)] = None
    workers: Annotated[Annotated[int, Meta(ge=1, le=256)] | None, setting(
        "batches run in parallel per model at load (POST /v1/cache/NAME/workers changes "
        "it)", example=1)] = None


class ServerBatching(BatchingOptions):
    """The agent's batching: the value of every key a model's config.yaml leaves out."""

    max_batch_size: Annotated[AtLeastZero, setting(
        "rows per batch at most, for models that do not set their own max_batch_size "
        "(0 or 1: never batched)")] = 32


SERVER_BATCHING = ServerBatching(enabled=True, adaptive=True, window_ms_max=100.0,
                                 aimd_step=2, budget_fraction=0.5, workers=1)


class AppOutput(Section):
    """The output a selection app combines (``selection.output``)."""

    name: Annotated[Text, setting("the members' output tensor")] = "Y"
    kind: Annotated[str, setting("label (INT64 [N, 1] class ids: a weighted vote), scores "
                                 "(FP32 [N, C]) or value (FP32): a weighted mean",
                                 check=choice(*OUTPUT_KINDS))] = "label"


class FeedbackOptions(Section):
    """How long predictions wait for their labels (``selection.feedback``)."""

    window_s: Annotated[Positive, setting("a prediction takes feedback this long")] = 600.0
    max_pending: Annotated[AtLeastOne, setting(
        "predictions waiting for feedback at most (the oldest fall out, counted)")] = 100_000


Candidate = Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*(:[0-9]+)?\Z",
                                extra={"expected": "a model name or name:version"})]


class SelectionOptions(Section):
    """A selection app (``backend: selection``): members it picks or combines, the
    policy that learns from feedback, what it answers when unsure (Clipper §5)."""

    policy: Annotated[str, setting("how members are picked and weighted",
                                   check=choice(*SELECTION_POLICIES), example="exp4")] = "exp4"
    candidates: Annotated[tuple[Candidate, ...], setting(
        "member models (name or name:version); their inputs and output must agree",
        min_length=1, example=["resnet", "mobilenet:2"])] = ()
    output: Annotated[AppOutput, setting("the output combined")] = \
        field(default_factory=AppOutput)
    default_output: Annotated[tuple[float, ...], setting(
        "each row's answer when no member answers in time or confidence is below "
        "min_confidence (flagged default)")] = (-1.0,)
    min_confidence: Annotated[Annotated[float, Meta(ge=0, le=1)] | None, setting(
        "rows whose share of members agreeing is below this get default_output",
        example=0.5)] = None
    context_parameter: Annotated[Text, setting(
        "the request parameter naming the user or session whose state is used")] = "context"
    max_contexts: Annotated[AtLeastOne, setting(
        "contexts kept (least recently used fall out of memory; persisted ones return)")] \
        = 10_000
    weights: Annotated[tuple[Annotated[float, Meta(ge=0)], ...], setting(
        "initial weights, one per candidate (static: the fixed split)",
        example=[0.9, 0.1])] = ()
    eta: Annotated[Positive, setting("exp3/exp4 learning rate")] = 0.1
    share: Annotated[Annotated[float, Meta(ge=0, lt=1)] | None, setting(
        "exp3/exp4 fixed share mixed back after each update (0: none; default 0.01, "
        "exp3 0.001)", example=0.01)] = None
    gamma: Annotated[float, setting("exp3 uniform exploration", ge=0, le=1)] = 0.05
    epsilon: Annotated[float, setting("epsilon_greedy exploration", ge=0, le=1)] = 0.1
    discount: Annotated[Annotated[float, Meta(gt=0, le=1)] | None, setting(
        "epsilon_greedy/thompson discount per observation (1: none; default 0.98, "
        "thompson 0.995)", example=0.995)] = None
    load_min_weight: Annotated[float, setting(
        "a cold member is loaded in the background only when its weight is at least "
        "this", ge=0, le=1)] = 0.1
    write_every_s: Annotated[Positive, setting(
        "learned state is written to $data_dir at most this often (and at shutdown)")] \
        = 2.0
    feedback: Annotated[FeedbackOptions, setting("the pending predictions")] = \
        field(default_factory=FeedbackOptions)

    def __post_init__(self) -> None:
        if not self.candidates:
            raise SchemaError("candidates", "required: at least one member model")
        if self.weights and len(self.weights) != len(self.candidates):
            raise SchemaError("weights", f"must give one weight per candidate "
                              f"({len(self.candidates)}), got {len(self.weights)}")
        if len(set(self.candidates)) != len(self.candidates):
            raise SchemaError("candidates", "names a member twice")
        if self.policy == "static" and self.weights and not sum(self.weights):
            raise SchemaError("weights", "must not all be 0")


class PredictionCacheOptions(Section):
    """Per-model prediction cache (``prediction_cache:``); None fields: the agent's."""

    enabled: Annotated[bool | None, setting(
        "cache outputs by input digest (per model version, CLOCK eviction)",
        example=False)] = None
    max_bytes: Annotated[int | None, setting(
        "the cache's size per model; larger outputs are not cached", check=size,
        example="64MiB")] = None


SERVER_PREDICTION_CACHE = PredictionCacheOptions(enabled=False, max_bytes=64 * 2**20)


class WarmupOptions(Section):
    """How a model is warmed up before it is reported ready (``warmup:``)."""

    mode: str = "default"  # default | none | file | inputs
    file: str | None = None
    inputs: tuple[Any, ...] | None = None

    @property
    def explicit(self) -> bool:
        """A sample the user gave: its failure fails the load."""
        return self.mode in ("file", "inputs")


def warmup_option(v: Any) -> WarmupOptions:
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


class DeclaredTensor(Section):
    """An input or output as a Triton ``config.pbtxt`` declares it: OIP datatype, full
    shape (the batch dimension included as -1 where the model batches)."""

    name: str
    datatype: str
    shape: tuple[int, ...]


class ModelConfig(Section):
    """A model's settings: <repository>/<model>/config.yaml, beside its version
    directories. Every key is optional; a key left out takes the agent's value (its
    config file's key of the same name). An unknown key is an error naming the file
    and the key."""

    backend: Annotated[str | None, setting(
        "the backend that serves it; left out: inferred from the files (model.onnx: "
        "onnx, saved_model.pb: tfserving; selection: an app over other models)",
        check=choice(*MODEL_BACKENDS), example="onnx")] = None
    device: Annotated[str, setting("cpu, cuda (cuda:0) or cuda:N", check=device)] = "cpu"
    slo: Annotated[SloOptions | None, setting("the model's latency SLO")] = None
    max_batch_size: Annotated[AtLeastZero | None, setting(
        "rows per batch at most (0 or 1: never batched)", example=8)] = None
    batching: Annotated[BatchingOptions, setting("how its requests are batched")] = \
        field(default_factory=BatchingOptions)
    max_queue: Annotated[AtLeastOne | None, setting(
        "tail drop: its queue this long rejects new requests (503)", example=50)] = None
    max_request_rows: Annotated[AtLeastOne | None, setting(
        "rows one request may carry; more get 413", example=2048)] = None
    prediction_cache: Annotated[PredictionCacheOptions, setting(
        "its prediction cache")] = field(default_factory=PredictionCacheOptions)
    pin: Annotated[bool, setting("never evict it")] = False
    cold_start: Annotated[str | None, setting(
        "a request while it is not loaded: serve (wait for the load) or reject (503 + "
        "Retry-After when the load outlasts the request's deadline)",
        check=choice(*COLD_START), example="serve")] = None
    load_wait_max_s: Annotated[NonNegative | None, setting(
        "its load waits this long for room, then 503", example=30)] = None
    load_retry_s: Annotated[NonNegative | None, setting(
        "after a failed load, requests get 503 this long before a new try",
        example=30)] = None
    idle_unload_s: Annotated[Positive | None, setting(
        "unload it when unused this long", example=600)] = None
    onnxruntime: Annotated[OrtOptions, setting("ONNX Runtime session options")] = \
        field(default_factory=OrtOptions)
    # -- models that travel (the disk tier) --
    source: Annotated[str | None, setting(
        "where its versions come from (s3://bucket/prefix, oci://registry/repo:tag, "
        "https://host/file#sha256=HEX, file:///path): the model directory then holds no "
        "version directories; they are pulled into data_dir/models on first use",
        check=source_url, example="s3://models/resnet")] = None
    source_options: Annotated[dict[str, Any] | None, setting(
        "options of its source (endpoint_url for MinIO/Ceph, region, sha256, ...); "
        "credentials come from the environment, never from here",
        check=source_options, example={"endpoint_url": "http://127.0.0.1:9000"})] = None
    version: Annotated[AtLeastOne | None, setting(
        "serve only this version of its source (left out: the newest it lists)",
        example=2)] = None
    digest: Annotated[str | None, setting(
        "the digest the version it serves must have (sha256:<hex>: an oci:// version's "
        "manifest digest, else the sha256 of its files' sha256sum listing); a pulled "
        "version that differs is refused and removed", check=version_digest,
        example="sha256:" + "0" * 64)] = None
    warmup: Annotated[WarmupOptions | None, setting(
        "warm-up before it is ready: default (one run on zeros shaped by the signature; "
        "a failure is logged), none, {file: sample.json} (a v2 request body in the model "
        "directory) or {inputs: [...]} (v2 inputs); a failing sample given here fails "
        "the load", check=warmup_option, example="default")] = None
    synthetic: Annotated[SyntheticOptions | None, setting(
        "what the synthetic backend pretends (backend: synthetic only)")] = None
    selection: Annotated[SelectionOptions | None, setting(
        "a selection app's members and policy (backend: selection only)")] = None
    #: From a Triton config.pbtxt or a load's config override: the inputs/outputs it
    #: declares (checked against the model at load) and where they were said.
    declared_inputs: Annotated[tuple[DeclaredTensor, ...] | None, INTERNAL] = None
    declared_outputs: Annotated[tuple[DeclaredTensor, ...] | None, INTERNAL] = None
    declared_in: Annotated[str | None, INTERNAL] = None


def parse_model_config(data: Any, file: str | Path | None = None) -> ModelConfig:
    """A ``ModelConfig`` from a parsed config.yaml mapping (errors name ``file``/key)."""
    config = load(ModelConfig, data, file)
    if config.synthetic is not None and config.backend != "synthetic":
        raise ConfigError(file, "synthetic", "only allowed with backend: synthetic")
    if (config.selection is not None) != (config.backend == "selection"):
        raise ConfigError(file, "selection", "only allowed with backend: selection"
                          if config.selection is not None else
                          "required with backend: selection")
    for key in ("source_options", "version", "digest"):
        if getattr(config, key) is not None and config.source is None:
            raise ConfigError(file, key, "only allowed with source")
    return config


def load_model_config(path: Path) -> ModelConfig:
    """Parse ``path`` (a model's config.yaml); a missing file gives the defaults."""
    if not path.exists():
        return ModelConfig()
    return parse_model_config(load_yaml(path), path)
