"""The model repository: ``<repo>/<model>/<version>/model.onnx|saved_model.pb``.

A model directory may hold a ``config.yaml`` (see ``agent.config``). Versions are the
numeric subdirectories; the highest is served by default. A synthetic model is a
directory with only a ``config.yaml`` (``backend: synthetic``) and gets version 1.
A model whose config or layout is wrong is still listed, with ``error`` saying why, so
one bad directory never hides the others.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from agent.config import ConfigError, ModelConfig, load_model_config

MODEL_FILES = {"onnx": "model.onnx", "tfserving": "saved_model.pb"}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class ModelSpec:
    """What the repository says about one model (not its runtime state)."""

    name: str
    path: Path
    versions: tuple[int, ...]
    config: ModelConfig
    backend: str | None
    error: str | None = None

    @property
    def default_version(self) -> int | None:
        return self.versions[-1] if self.versions else None

    def model_file(self, version: int) -> Path | None:
        """The file a backend loads for ``version`` (None for synthetic models)."""
        name = MODEL_FILES.get(self.backend or "")
        return self.path / str(version) / name if name else None


def _infer_backend(model_dir: Path, versions: tuple[int, ...]) -> str | None:
    for version in reversed(versions):
        for backend, filename in MODEL_FILES.items():
            if (model_dir / str(version) / filename).exists():
                return backend
    return None


def scan_model(model_dir: Path) -> ModelSpec:
    """Describe one model directory; problems go to ``error``, never raise."""
    versions = tuple(sorted(int(p.name) for p in model_dir.iterdir()
                            if p.is_dir() and p.name.isascii() and p.name.isdigit()))
    try:
        config = load_model_config(model_dir / "config.yaml")
    except ConfigError as exc:
        return ModelSpec(model_dir.name, model_dir, versions, ModelConfig(), None, str(exc))
    backend = config.backend or _infer_backend(model_dir, versions)
    error = None
    if backend == "synthetic":
        versions = versions or (1,)
    elif backend is None:
        error = (f"{model_dir}: no version directory holds model.onnx or saved_model.pb "
                 "and config.yaml names no backend")
    else:
        missing = [v for v in versions if not (model_dir / str(v) / MODEL_FILES[backend]).exists()]
        if not versions:
            error = f"{model_dir}: no numeric version directory"
        elif missing:
            error = (f"{model_dir}: version(s) {', '.join(map(str, missing))} lack "
                     f"{MODEL_FILES[backend]} (backend {backend})")
    return ModelSpec(model_dir.name, model_dir, versions, config, backend, error)


def scan_repository(root: str | Path) -> dict[str, ModelSpec]:
    """All models under ``root`` by name. A missing root is an error, an empty one is not."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"model repository {root} is not a directory")
    models = {}
    for child in sorted(root.iterdir()):
        if child.is_dir() and _NAME.match(child.name):
            models[child.name] = scan_model(child)
    return models
