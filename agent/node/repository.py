"""The model repository: ``<repo>/<model>/<version>/model.onnx|saved_model.pb``.

A model directory may hold a ``config.yaml`` (see ``agent.config``) and a Triton
``config.pbtxt`` (see ``agent.node.triton_config``: what maps onto the model config is
applied, what cannot be honoured makes the model an error). Versions are the
numeric subdirectories; the highest is served by default. A synthetic model is a
directory with only a ``config.yaml`` (``backend: synthetic``) and gets version 1, as
does a selection app (``backend: selection``, served by ``agent.node.selection``).
A model whose config or layout is wrong is still listed, with ``error`` saying why, so
one bad directory never hides the others.

A *sourced* model names a ``source:`` in its config.yaml and holds no version
directories: its versions are its source's listing (``Listing``, which the disk tier,
``agent.node.cache.disktier``, keeps) and its files live under the tier's directory
(``files_root``), never in the repository.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from agent.config import ConfigError, ModelConfig, load_model_config
from agent.node import triton_config

log = logging.getLogger("edgeagent.repository")

MODEL_FILES = {"onnx": "model.onnx", "tfserving": "saved_model.pb"}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*\Z")


@dataclass(frozen=True)
class ModelSpec:
    """What the repository says about one model (not its runtime state)."""

    name: str
    path: Path
    versions: tuple[int, ...]
    config: ModelConfig
    backend: str | None
    error: str | None = None
    #: Where the version directories live (a sourced model's: the disk tier's); None:
    #: ``path``, the repository's model directory.
    files_root: Path | None = None
    #: Why a sourced model has no versions yet though nothing is wrong with it (its
    #: source not listed yet, or unreachable with no listing kept): a 503, not a 400.
    pending: str | None = None

    @property
    def default_version(self) -> int | None:
        return self.versions[-1] if self.versions else None

    @property
    def sourced(self) -> bool:
        """Its versions come from ``config.source`` (pulled by the disk tier)."""
        return self.config.source is not None

    @property
    def version_root(self) -> Path:
        """The directory that holds its ``<version>/`` directories."""
        return self.files_root or self.path

    def model_file(self, version: int) -> Path | None:
        """The file a backend loads for ``version`` (None for synthetic models)."""
        name = MODEL_FILES.get(self.backend or "")
        return self.version_root / str(version) / name if name else None


@dataclass(frozen=True)
class Listing:
    """A sourced model's versions as the disk tier knows them: the listing (kept on
    disk, so a restart with the source down still has it), where their files go, and
    why there are none (``error``: its config is wrong; ``pending``: not listed yet)."""

    versions: tuple[int, ...]
    files_root: Path
    error: str | None = None
    pending: str | None = None


#: ``listing(name, config, config_file)``: the disk tier's ``Listing`` of a sourced model.
Listings = Callable[[str, ModelConfig, Path], Listing]


def _infer_backend(model_dir: Path, versions: tuple[int, ...]) -> str | None:
    for version in reversed(versions):
        for backend, filename in MODEL_FILES.items():
            if (model_dir / str(version) / filename).exists():
                return backend
    return None


def _scan_sourced(model_dir: Path, versions: tuple[int, ...], config: ModelConfig,
                  backend: str, listings: Listings | None) -> ModelSpec:
    """A sourced model: its versions from ``listings`` (the disk tier's)."""
    name, where = model_dir.name, f"{model_dir.name}/config.yaml"
    if versions:
        return ModelSpec(name, model_dir, versions, config, backend,
                         f"{where}: source: a sourced model keeps no version directories "
                         f"in the repository (found {', '.join(map(str, versions))})")
    if listings is None:
        return ModelSpec(name, model_dir, (), config, backend,
                         f"{where}: source: this agent has no disk tier to pull into")
    listing = listings(name, config, Path(where))
    return ModelSpec(name, model_dir, listing.versions, config, backend, listing.error,
                     files_root=listing.files_root, pending=listing.pending)


def scan_model(model_dir: Path, listings: Listings | None = None) -> ModelSpec:
    """Describe one model directory; problems go to ``error``, never raise. Messages name
    files relative to the repository (``resnet/config.yaml: ...``), never where it is.
    ``listings``: the versions of sourced models (the disk tier's)."""
    versions = tuple(sorted(int(p.name) for p in model_dir.iterdir()
                            if p.is_dir() and p.name.isascii() and p.name.isdigit()))
    try:
        config = load_model_config(model_dir / "config.yaml")
    except ConfigError as exc:
        error = ConfigError(f"{model_dir.name}/config.yaml", exc.key, exc.message)
        return ModelSpec(model_dir.name, model_dir, versions, ModelConfig(), None, str(error))
    backend = config.backend or ("onnx" if config.source is not None
                                 else _infer_backend(model_dir, versions))
    pbtxt = model_dir / "config.pbtxt"
    if pbtxt.is_file():
        where = f"{model_dir.name}/config.pbtxt"
        try:
            text = pbtxt.read_text(encoding="utf-8")
            config = triton_config.apply(triton_config.parse_pbtxt(text, where), config,
                                         model=model_dir.name, backend=backend, file=where,
                                         conflicts=True)
        except (ConfigError, OSError, UnicodeDecodeError) as exc:
            return ModelSpec(model_dir.name, model_dir, versions, ModelConfig(), backend,
                             str(exc))
    if config.source is not None:
        return _scan_sourced(model_dir, versions, config, backend, listings)
    error = None
    if backend in ("synthetic", "selection"):
        versions = versions or (1,)
    elif backend is None:
        error = (f"{model_dir.name}: no version directory holds model.onnx or "
                 "saved_model.pb and config.yaml names no backend")
    else:
        missing = [v for v in versions if not (model_dir / str(v) / MODEL_FILES[backend]).exists()]
        if not versions:
            error = f"{model_dir.name}: no numeric version directory"
        elif missing:
            error = (f"{model_dir.name}: version(s) {', '.join(map(str, missing))} lack "
                     f"{MODEL_FILES[backend]} (backend {backend})")
    return ModelSpec(model_dir.name, model_dir, versions, config, backend, error)


def unlisted(specs: dict[str, ModelSpec], listed: set[str]) -> dict[str, ModelSpec]:
    """The models of a scan that no cache entry stands for (``listed``: the names that
    have one) because they have no version to show: an invalid config.yaml of a
    synthetic or sourced model (``error``), a source not listed yet (``pending``). The
    cache listing and the repository index show them, with why, so none vanishes."""
    return {name: spec for name, spec in sorted(specs.items())
            if name not in listed and (spec.error or spec.pending)}


def apply_override(spec: ModelSpec, data: Any) -> ModelSpec:
    """``spec`` with a load's ``parameters.config`` (a parsed JSON object in Triton's
    model config fields) applied over its repository config; ``ConfigError`` saying
    why it cannot be, leaving ``spec`` as it was."""
    where = "parameters.config"
    message = triton_config.parse_json_config(data, where)
    config = triton_config.apply(message, spec.config, model=spec.name, backend=spec.backend,
                                 file=where, conflicts=False)
    return replace(spec, config=config)


def read_warmup_sample(spec: ModelSpec) -> tuple[dict | None, str]:
    """(the warm-up inputs ``spec``'s config gives, decoded; where they come from, for
    messages): a v2 request body in the model directory (``warmup: {file: F}``) or
    inline v2 inputs (``warmup: {inputs: [...]}``); (None, ...) for the default.
    ``BackendError`` naming the file and the problem when it cannot be read. Blocking."""
    import json

    from agent.backends.base import BackendError
    from agent.node.tensors import decode_v2_request

    option = spec.config.warmup
    if option is None or not option.explicit:
        return None, "warmup"
    if option.file is not None:
        where = f"{spec.name}/{option.file}"
        try:
            body = (spec.path / option.file).read_bytes()
        except OSError as exc:
            raise BackendError(f"{where}: cannot read the warm-up sample: "
                               f"{exc.strerror}") from None
    else:
        where = f"{spec.name}/config.yaml: warmup.inputs"
        body = json.dumps({"inputs": list(option.inputs)}).encode()
    try:
        inputs, _ = decode_v2_request(body, None)
    except ValueError as exc:
        raise BackendError(f"{where}: not a v2 inputs sample: {exc}") from None
    return inputs, where


def scan_repository(root: str | Path, listings: Listings | None = None, *,
                    also: tuple[Path, ...] = ()) -> dict[str, ModelSpec]:
    """All models under ``root`` by name. A missing root is an error, an empty one is not.
    ``listings``: the versions of sourced models (the disk tier's). ``also``: more roots
    (the coordinator's assigned models), scanned after ``root`` where they exist; a name
    an earlier root has wins (logged)."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"model repository {root} is not a directory")
    models: dict[str, ModelSpec] = {}
    for where in (root, *(r for r in also if r.is_dir())):
        for child in sorted(where.iterdir()):
            if not (child.is_dir() and _NAME.match(child.name)):
                continue
            if child.name in models:
                log.warning("model %s: %s is shadowed by %s (the repository's own entry "
                            "wins)", child.name, child, models[child.name].path)
                continue
            models[child.name] = scan_model(child, listings)
    return models
