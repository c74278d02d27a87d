"""The model catalog: each model's SLO and priority, as set through ``PUT /v1/models/{name}``
or ``edgeagent coordinator models set``, and where nodes that do not hold it pull it
from. Only catalogued models are planned.

JSON (every field but ``slo_ms`` optional)::

    {"slo_ms": 200, "percentile": 99, "priority": 1, "cpu_per_replica": 1,
     "memory_per_replica_bytes": 0, "proc_ms": null,
     "source": "s3://models/resnet", "source_options": {"endpoint_url": "http://10.0.0.9:9000"},
     "version": 2, "digest": "sha256:<64 hex>",
     "config": {"backend": "onnx", "max_batch_size": 8},
     "rollout": {"waves": [1, "25%"], "bake_s": 120, "gates": {"max_latency_ratio": 1.3}}}

``proc_ms`` is the processing time used until nodes have measured one. ``source`` makes
the model placeable on any live node (the plan's pull directives carry it, its options,
the pinned ``version`` and ``digest`` when given, and ``config``: the model's config.yaml
keys, checked by the node's own model-config validation). ``source_options`` never hold
credentials: a key that looks like one is refused, as is a URL with a user, a password
or a query string (nodes take credentials from their own environment).

``version`` is the one version the nodes serve (``digest``: its content); a new one
rolls out in waves (``agent.coordinator.rollout``), with the entry's ``rollout``
settings over the coordinator config's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from agent.config import parse_model_config, version_digest
from agent.errors import AgentError
from agent.validation import ConfigError, number
from agent.wire import NAME, refuse_credentials


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
    source: str | None = None
    source_options: dict[str, Any] | None = None
    version: int | None = None
    digest: str | None = None
    config: dict[str, Any] | None = None
    #: how a new version of it rolls out (``rollout.RolloutSettings`` keys, over the
    #: coordinator config's ``rollout:``); None: the config's
    rollout: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def pull(self) -> dict[str, Any] | None:
        """What a node needs to pull and serve this model (``wire.Pull``'s fields but
        ``model`` and ``load``); None without a source."""
        if self.source is None:
            return None
        return {"source": self.source, "source_options": dict(self.source_options or {}),
                "version": self.version, "digest": self.digest,
                "config": dict(self.config or {})}


_POSITIVE = number(0, strict_lo=True, finite=True)
_FIELDS = {
    "slo_ms": _POSITIVE,
    "percentile": number(0, 100, strict_lo=True, strict_hi=True, finite=True),
    "priority": number(0, finite=True),
    "cpu_per_replica": _POSITIVE,
    "memory_per_replica_bytes": number(0, finite=True),
    "proc_ms": _POSITIVE,
}
#: Where the model comes from (``source`` and what goes with it).
_SOURCE_FIELDS = ("source", "source_options", "version", "digest", "config")
#: Keys of a model's config that the catalog entry itself says, or the plan does (its
#: directives pin what a node runs; a pin in the config would outlive a drop).
_NOT_IN_CONFIG = {"source": "set the entry's own 'source' field",
                  "source_options": "set the entry's own 'source_options' field",
                  "version": "set the entry's own 'version' field",
                  "digest": "set the entry's own 'digest' field",
                  "pin": "the plan's directives pin what a node runs"}


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
    unknown = sorted(set(data) - set(_FIELDS) - set(_SOURCE_FIELDS) - {"name", "rollout"})
    if unknown:
        raise CatalogError(f"unknown field {unknown[0]!r} (expected: "
                           f"{', '.join((*_FIELDS, *_SOURCE_FIELDS, 'rollout'))})")
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
    rollout = data.get("rollout")
    if rollout is not None:
        rollout_settings(rollout, "rollout")  # checked; kept as given
    return ModelSLO(name=name, **values, **parse_source(data), rollout=rollout)


def rollout_settings(data: Any, where: str, base: Any = None) -> Any:
    """``data`` (``RolloutSettings`` keys) over ``base`` (a ``RolloutSettings``; None:
    the defaults), checked: ``CatalogError`` names the bad key under ``where``."""
    from msgspec import structs

    from agent.coordinator.rollout import RolloutSettings
    from agent.schema import load

    if not isinstance(data, dict):
        raise CatalogError(f"field {where!r} must be an object of rollout settings "
                           f"(waves, bake_s, wave_timeout_s, gates), got {data!r}")
    merged = dict(data)
    if base is not None:  # the keys given over base's, gates key by key
        gates = data.get("gates", {})
        merged = {**structs.asdict(base), "waves": list(base.waves), **data,
                  "gates": {**structs.asdict(base.gates), **gates}
                  if isinstance(gates, dict) else gates}
    try:
        return load(RolloutSettings, merged)
    except ConfigError as exc:
        raise CatalogError(f"field {where}.{exc.key}: {exc.message}" if exc.key
                           else f"field {where!r}: {exc.message}") from None


def check_source(url: str, options: dict[str, Any]) -> None:
    """``CatalogError`` unless a node could open ``url`` with ``options``: the sources'
    own check (``agent.sources.open_source``; nothing is fetched). A source whose client
    the coordinator lacks (boto3, for s3://) passes: the nodes pull, not the coordinator."""
    from agent.sources import SourceError, open_source
    from agent.sources.s3source import MISSING

    try:
        open_source(url, options)
    except SourceError as exc:
        if not str(exc).startswith(MISSING):
            raise CatalogError(str(exc)) from None


def parse_source(data: dict[str, Any]) -> dict[str, Any]:
    """The source fields of a catalog entry, checked; ``CatalogError`` names the bad one
    (a credential-like option among them)."""
    given = {k: data[k] for k in _SOURCE_FIELDS if data.get(k) is not None}
    if "source" not in given:
        if given:
            raise CatalogError(f"field {sorted(given)[0]!r} needs field 'source' (where "
                               "nodes pull the model from)")
        return {}
    options = given.get("source_options", {})
    try:
        refuse_credentials(given["source"], options)
    except ValueError as exc:
        raise CatalogError(str(exc)) from None
    check_source(given["source"], options)
    out: dict[str, Any] = {"source": given["source"], "source_options": dict(options)}
    version = given.get("version")
    if version is not None:
        if type(version) is not int or not 1 <= version <= 999_999_999:
            raise CatalogError(f"field 'version' must be a whole number >= 1, got {version!r}")
        out["version"] = version
    digest = given.get("digest")
    if digest is not None:
        try:
            out["digest"] = version_digest(digest)
        except ValueError as exc:
            raise CatalogError(f"field 'digest' {exc}") from None
    config = given.get("config", {})
    if not isinstance(config, dict):
        raise CatalogError("field 'config' must be an object of the model's config.yaml "
                           f"keys, got {type(config).__name__}")
    for key, why in _NOT_IN_CONFIG.items():
        if key in config:
            raise CatalogError(f"field 'config' may not hold {key!r}: {why}")
    try:
        parse_model_config(config)
    except ConfigError as exc:
        where = f"config.{exc.key}" if exc.key else "config"
        raise CatalogError(f"field {where!r} {exc.message}") from None
    out["config"] = config
    return out
