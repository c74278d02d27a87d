"""The cache as a package of one-job modules behind a short façade: no module outside
``agent/node/cache/`` writes an entry's fields or moves it (its lifecycle's moves, its
leases and pins are the package's), and the façade stays short enough to read at once.
Read from the code's own syntax tree (``ast``); nothing is imported to find them."""

import ast
import dataclasses
from pathlib import Path

from agent.node.cache.entry import Accounting, Entry, Statistics
from agent.node.cache.lifecycle import Lifecycle

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "agent" / "node" / "cache"

#: The fields of each part of an entry, by the attribute that holds the part.
PARTS = {"account": {f.name for f in dataclasses.fields(Accounting)},
         "life": {f.name for f in dataclasses.fields(Lifecycle)} | {"state", "phase"},
         "stats": {f.name for f in dataclasses.fields(Statistics)}}
ENTRY_FIELDS = {f.name for f in dataclasses.fields(Entry)}
#: The verbs that move an entry or change what may evict it.
MOVES = {"lease", "unlease", "pin", "begin_load", "loaded", "load_failed", "gave_up",
         "begin_unload", "unloaded", "forget_failure"}


def _names_an_entry(node: ast.expr) -> bool:
    text = ast.unparse(node).lower()
    return "entry" in text or "entries" in text


def _part_of(owner: ast.expr) -> str | None:
    """The part ``owner`` is: ``<entry>.account`` or a local ``account`` (an alias)."""
    if isinstance(owner, ast.Attribute) and owner.attr in PARTS \
            and _names_an_entry(owner.value):
        return owner.attr
    if isinstance(owner, ast.Name) and owner.id in PARTS:
        return owner.id
    return None


def _targets(node: ast.AST) -> list[ast.expr]:
    targets = node.targets if isinstance(node, ast.Assign) else \
        [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
    return [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]


def entry_writes(path: Path) -> list[str]:
    """``file:line: what`` of every write to an entry's fields, or move of one."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        for target in _targets(node):
            if not isinstance(target, ast.Attribute):
                continue
            part = _part_of(target.value)
            if (part is not None and target.attr in PARTS[part]) or (
                    target.attr in ENTRY_FIELDS and _names_an_entry(target.value)):
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(target)}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in MOVES and (_names_an_entry(node.func.value)
                                                 or _part_of(node.func.value)):
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node.func)}()")
    return found


def test_no_module_outside_the_cache_package_writes_an_entrys_fields():
    outside = [p for p in sorted((ROOT / "agent").rglob("*.py"))
               if PACKAGE not in p.parents]
    assert [w for p in outside for w in entry_writes(p)] == []


def test_the_finder_sees_the_writes_the_package_makes():
    # the check above finds what it is meant to: the package itself writes and moves
    found = [w for p in sorted(PACKAGE.glob("*.py")) for w in entry_writes(p)]
    assert any("account.size_bytes" in w for w in found), found
    assert any(w.endswith("life.begin_load()") for w in found), found
    assert any(w.endswith(".pin()") for w in found), found


def test_the_facade_is_short():
    lines = len((PACKAGE / "modelcache.py").read_text().splitlines())
    assert lines <= 300, f"agent/node/cache/modelcache.py has {lines} lines"
