"""The layers of docs/architecture.md, drawn from the code's own imports (``ast``; no
module is imported): a forbidden import fails here, naming the file and the line; and
the house rules that keep its rooms readable (no circle, one name per class, no file over
600 lines, no function of the node over 50).

Every import counts, in functions too; for the layer rules also those under
``if TYPE_CHECKING:`` (a type-only import still ties the layers), for the circles only
those that run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(path: Path, source: str | None = None) -> list[tuple[str, int, bool]]:
    """(imported module, line, only under TYPE_CHECKING) for every import in ``path``
    (or in ``source``, read as if it stood there). ``from package import name`` counts as
    importing ``package.name`` when that is a module of the tree, else ``package``."""
    tree = ast.parse(path.read_text() if source is None else source, str(path))
    package = _module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" \
        else _module_name(path)
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            typing_only.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    out = []
    for node in ast.walk(tree):
        hint = id(node) in typing_only
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno, hint) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.append((full if _exists(full) else base, node.lineno, hint))
    return out


def _exists(module: str) -> bool:
    path = ROOT.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _files(*folders: str) -> list[Path]:
    return sorted(p for f in folders for p in (ROOT / f).rglob("*.py"))


MODULES = {_module_name(p): p for p in _files("agent", "cachepolicies")}


def _violations(sources: list[Path], forbidden: tuple[str, ...], *,
                with_hints: bool = True) -> list[str]:
    found = []
    for path in sources:
        for module, line, hint in _imports(path):
            if hint and not with_hints:
                continue
            if any(module == f or module.startswith(f + ".") for f in forbidden):
                found.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return found


def _cycles(names: set[str]) -> list[list[str]]:
    """Circles among ``names`` through imports that run (not type-only ones)."""
    graph = {n: sorted({m for m, _, hint in _imports(MODULES[n]) if m in names and m != n
                        and not hint}) for n in names}
    cycles, index, low, stack, on_stack = [], {}, {}, [], set()

    def visit(n: str) -> None:  # Tarjan's strongly connected components
        index[n] = low[n] = len(index)
        stack.append(n)
        on_stack.add(n)
        for m in graph[n]:
            if m not in index:
                visit(m)
                low[n] = min(low[n], low[m])
            elif m in on_stack:
                low[n] = min(low[n], index[m])
        if low[n] == index[n]:
            component = []
            while True:
                m = stack.pop()
                on_stack.discard(m)
                component.append(m)
                if m == n:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for n in sorted(names):
        if n not in index:
            visit(n)
    return cycles


def test_backends_know_no_node_coordinator_or_command():
    assert _violations(_files("agent/backends"),
                       ("agent.node", "agent.coordinator", "agent.commands")) == []


def test_node_and_coordinator_never_import_each_other():
    assert _violations(_files("agent/node"), ("agent.coordinator",)) == []
    assert _violations(_files("agent/coordinator"), ("agent.node", "agent.backends")) == []


LEAVES = ("units.py", "validation.py", "schema.py", "memory.py", "wire.py", "modelzoo.py",
          "onnxfile.py", "errors.py", "backoff.py", "tracing.py")
#: The folders of shared leaves: who may call, HTTP plumbing, the configuration.
LEAF_FOLDERS = ("agent/security", "agent/http", "agent/config")
UPPER = ("agent.backends", "agent.node", "agent.coordinator", "agent.commands", "agent.cli",
         "agent.profiling")


def test_shared_leaves_import_no_upper_layer():
    leaves = [ROOT / "agent" / f for f in LEAVES]
    assert all(p.exists() for p in leaves), "a shared leaf moved: update LEAVES and docs/architecture.md"
    folders = _files(*LEAF_FOLDERS)
    assert all(any(p.parent == ROOT / f for p in folders) for f in LEAF_FOLDERS), \
        "a leaf folder moved: update LEAF_FOLDERS and docs/architecture.md"
    assert _violations(leaves + folders, UPPER) == []


def test_the_leaf_folders_stack_without_a_circle():
    # configuration declares the security settings (TLS, auth); security imports no
    # configuration, HTTP plumbing neither
    assert _violations(_files("agent/security", "agent/http"), ("agent.config",)) == []
    assert _violations(_files("agent/http"), ("agent.security",)) == []


def test_the_cache_package_sits_below_serving():
    # the cache knows the repository and nothing else of the node: serving, the front
    # desk, selection, metrics and the routes build on it, never the other way
    others = tuple(sorted({n for n in MODULES if n.startswith("agent.node.")
                           and not n.startswith("agent.node.cache")
                           and n != "agent.node.repository"}))
    assert _violations(_files("agent/node/cache"), others) == []


def test_the_request_object_sits_below_what_serves_it():
    # the front desk hands a call to serving or an app; neither knows the desk
    below = [ROOT / "agent/node/call.py", ROOT / "agent/node/serving.py",
             *_files("agent/node/selection")]
    assert _violations(below, ("agent.node.frontdesk",)) == []
    assert _violations([ROOT / "agent/node/call.py"],
                       ("agent.node.serving", "agent.node.selection")) == []


def test_sources_are_a_shared_leaf():
    # agent/sources (where models come from) sits beside the leaves: the node, the
    # coordinator and the commands build on it, never the other way.
    sources = _files("agent/sources")
    assert sources, "agent/sources moved: update this test and docs/architecture.md"
    assert _violations(sources, ("agent.backends", "agent.node", "agent.coordinator",
                                 "agent.commands", "agent.cli", "agent.profiling")) == []


def test_cachepolicies_knows_no_agent():
    assert _violations(_files("cachepolicies"), ("agent",)) == []


def test_node_routes_do_not_import_the_app():
    routes = [p for p in _files("agent/node")
              if p.name.startswith("api_") or p.name == "reporter.py"]
    assert routes, "no api_*.py found under agent/node"
    assert _violations(routes, ("agent.node.app",)) == []


def test_no_circle_among_backends():
    assert _cycles({n for n in MODULES if n.startswith("agent.backends.")}) == []


def test_no_circle_anywhere():
    assert _cycles(set(MODULES)) == []


def test_each_class_name_is_defined_once():
    where: dict[str, list[str]] = {}
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(name)
    assert {c: m for c, m in where.items() if len(m) > 1} == {}


def test_no_file_over_600_lines():
    long = {str(p.relative_to(ROOT)): n for p in MODULES.values()
            if (n := len(p.read_text().splitlines())) > 600}
    assert long == {}


def test_no_function_in_the_node_over_50_lines():
    long = {f"{p.relative_to(ROOT)}:{node.name}": node.end_lineno - node.lineno + 1
            for p in _files("agent/node") if "protos" not in p.parts
            for node in ast.walk(ast.parse(p.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > 50}
    assert long == {}


def test_no_circle_among_the_node_app_and_its_routes():
    names = {n for n in MODULES if n.startswith("agent.node.")
             and (n.rsplit(".", 1)[1].startswith("api_") or n == "agent.node.app")}
    assert _cycles(names) == []


@pytest.mark.parametrize("source, expected", [
    ("from agent.node.app import NODE\n", ["agent.node.app"]),
    ("from agent.node import app\n", ["agent.node.app"]),
    ("from . import app\n", ["agent.node.app"]),
    ("import agent.coordinator.plan as p\n", ["agent.coordinator.plan"]),
    ("def f():\n    from agent.coordinator import plan\n", ["agent.coordinator.plan"]),
])
def test_the_walk_sees_every_import_form(source, expected):
    probe = ROOT / "agent" / "node" / "api_probe.py"
    assert [m for m, _, _ in _imports(probe, source)] == expected
