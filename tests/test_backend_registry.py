"""The backend registry: names → classes imported lazily, and the backends' layer (they
import the shared leaves below them, never the node)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from agent.backends import REGISTRY, BackendError, backend_class, make_backend
from agent.backends.base import Backend
from agent.config import BACKENDS, parse_model_config
from agent.memory import FootprintModel

ROOT = Path(__file__).resolve().parents[1]


def test_every_registered_backend_is_a_backend_with_its_facts():
    assert set(REGISTRY) == set(BACKENDS)
    for kind in REGISTRY:
        cls = backend_class(kind)
        assert issubclass(cls, Backend) and cls.kind == kind and "cpu" in cls.PRIORS
    assert backend_class("onnx").MODEL_FILE == "model.onnx"
    assert backend_class("tfserving").MODEL_FILE == "saved_model.pb"


def test_unknown_kind_and_missing_host_are_backend_errors(tmp_path):
    config, footprints = parse_model_config({}), FootprintModel()
    with pytest.raises(BackendError, match=r"backend 'pytorch' is not available in this "
                       r"agent \(available: onnx, synthetic, tfserving\)"):
        make_backend("pytorch", "m", 1, tmp_path, config, footprints)
    with pytest.raises(BackendError, match="needs the agent's TF Serving server"):
        make_backend("tfserving", "m", 1, tmp_path, config, footprints)


def test_the_onnx_path_never_imports_tf_serving(tmp_path):
    script = f"""
import sys
from pathlib import Path
from agent.backends import make_backend, load_measured
from agent.config import parse_model_config
from agent.memory import FootprintModel, MemoryMeter
from agent.modelzoo import write_mlp
write_mlp(Path({str(tmp_path)!r}) / "m" / "1" / "model.onnx", inputs=4, hidden=8, layers=1,
          outputs=2)
b = make_backend("onnx", "m", 1, Path({str(tmp_path)!r}) / "m", parse_model_config({{}}),
                 FootprintModel())
b.estimate(); load_measured(b, MemoryMeter()); b.unload()
print(sorted(m for m in sys.modules if "tfserving" in m or "tensorflow" in m))
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def imports_of(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_backends_and_memory_never_import_the_node_or_the_coordinator():
    files = [*sorted((ROOT / "agent" / "backends").glob("*.py")), ROOT / "agent" / "memory.py"]
    for path in files:
        bad = {m for m in imports_of(path)
               if m.startswith(("agent.node", "agent.coordinator", "agent.commands"))}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"
    assert not {m for m in imports_of(ROOT / "agent" / "memory.py")
                if m.startswith("agent.backends")}
    assert not (ROOT / "agent" / "node" / "memory.py").exists()
