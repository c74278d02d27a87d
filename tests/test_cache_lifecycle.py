"""The cache as a state machine: the transition table refuses every move it does not
hold (a real exception, so also under ``python -O``), the cache makes every move it
holds, state is assigned nowhere but in ``transition``, and the cache's functions stay
short enough to read at once."""

import ast
import asyncio
import collections
import functools
import itertools
from pathlib import Path

import pytest

from agent.node.cache import lifecycle as lifecycle_module
from agent.node.cache import CacheBusy, LoadFailed, ModelCache
from agent.node.cache.entry import Entry
from agent.node.cache.lifecycle import (AT_REST, TRANSITIONS, IllegalTransition, Lifecycle, State,
                                  transition)
from agent.node.repository import scan_repository
from tests.helpers import add_synthetic

ROOT = Path(__file__).resolve().parent.parent
#: The cache and the modules split out of it.
CACHE_MODULES = sorted((ROOT / "agent" / "node" / "cache").glob("*.py"))
MB = 1_000_000
LEGAL = [(a, b) for a, b in itertools.product(State, State) if b in TRANSITIONS[a]]
ILLEGAL = [(a, b) for a, b in itertools.product(State, State) if b not in TRANSITIONS[a]]


def reach(state: State) -> Lifecycle:
    """A lifecycle brought to ``state`` by legal moves only (the shortest way there)."""
    paths = {State.UNLOADED: [State.UNLOADED]}
    todo = collections.deque([State.UNLOADED])
    while todo:
        here = todo.popleft()
        for there in sorted(TRANSITIONS[here]):
            if there not in paths:
                paths[there] = paths[here] + [there]
                todo.append(there)
    life = Lifecycle("m:1")
    for here, there in itertools.pairwise(paths[state]):
        transition(life, there, expected_from=here)
    assert life.state is state
    return life


def test_the_table_names_every_state_and_leads_only_to_states():
    assert set(TRANSITIONS) == set(State)
    assert all(to <= set(State) for to in TRANSITIONS.values())
    assert ILLEGAL and len(LEGAL) + len(ILLEGAL) == len(State) ** 2
    assert AT_REST == {State.UNLOADED, State.FAILED}


@pytest.mark.parametrize("current,to", ILLEGAL, ids=lambda s: s.value)
def test_every_move_outside_the_table_raises_and_changes_nothing(current, to):
    life = reach(current)
    with pytest.raises(IllegalTransition) as err:
        transition(life, to, expected_from=current)
    assert life.state is current
    assert str(err.value) == (f"model m:1: illegal move {current.value} -> {to.value}: "
                              "not in the transition table")
    assert (err.value.model, err.value.current, err.value.to) == ("m:1", current, to)


@pytest.mark.parametrize("current,to", LEGAL, ids=lambda s: s.value)
def test_every_move_in_the_table_passes(current, to):
    life = reach(current)
    assert transition(life, to, expected_from=current) is current
    assert life.state is to


@pytest.mark.parametrize("current,to", LEGAL, ids=lambda s: s.value)
def test_a_legal_move_from_an_unexpected_state_raises(current, to):
    life = reach(current)
    others = [s for s in State if s is not current]
    with pytest.raises(IllegalTransition, match="expected from"):
        transition(life, to, expected_from=others)
    assert life.state is current


def test_state_cannot_be_assigned_around_transition(tmp_path):
    add_synthetic(tmp_path, "m")
    entry = Entry(scan_repository(tmp_path)["m"], 1)
    with pytest.raises(AttributeError):
        entry.state = State.READY
    with pytest.raises(AttributeError):
        entry.life.state = State.READY
    with pytest.raises(TypeError):
        Lifecycle("m:1", _state=State.READY)
    assert entry.state is State.UNLOADED and entry.life.model == "m:1"


def _state_assignments(path: Path) -> list[str]:
    """``function:line`` of every assignment to an attribute ``state`` or ``_state``."""
    out = []
    tree = ast.parse(path.read_text())
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(func):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for target in targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Attribute) and leaf.attr in ("state", "_state"):
                        out.append(f"{path.name}:{func.name}:{node.lineno}")
    return sorted(set(out))


def test_state_is_assigned_only_in_transition():
    found = [where for path in CACHE_MODULES for where in _state_assignments(path)]
    assert len(found) == 1 and found[0].startswith("lifecycle.py:transition:"), found


@pytest.mark.parametrize("path", CACHE_MODULES, ids=lambda p: p.name)
def test_no_function_in_the_cache_is_over_50_lines(path):
    tree = ast.parse(path.read_text())
    long = {node.name: node.end_lineno - node.lineno + 1 for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > 50}
    assert long == {}


async def test_the_cache_makes_every_move_in_the_table(repo, monkeypatch):
    """Load, evict, give up waiting for room, fail, retry, forget a failure: the moves
    the cache made are exactly the table's (so the table holds no dead move)."""
    made = []

    def recording(life, to, *, expected_from):
        made.append((transition(life, to, expected_from=expected_from), to))

    monkeypatch.setattr(lifecycle_module, "transition", recording)
    for name in "ab":
        add_synthetic(repo, name, size_bytes=60 * MB)
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "1" / "model.onnx").write_bytes(b"not an onnx model")
    cache = ModelCache(scan_repository(repo), {"cpu": 100 * MB}, policy="lru",
                       load_wait_max_s=0.1)
    a = await cache.acquire("a")            # UNLOADED -> LOADING -> READY
    with pytest.raises(CacheBusy):          # LOADING -> UNLOADED: no room in time
        await cache.acquire("b")
    cache.release(a)
    await cache.evict("a")                  # READY -> UNLOADING -> UNLOADED
    with pytest.raises(LoadFailed):         # LOADING -> FAILED
        await cache.acquire("broken")
    with pytest.raises(LoadFailed):         # FAILED -> LOADING -> FAILED: retried at once
        await cache.ensure_loaded("broken")
    cache.forget_failure(cache.entry("broken"))  # FAILED -> UNLOADED
    assert cache.entry("broken").state is State.UNLOADED
    await cache.close()
    assert set(made) == set(LEGAL)


async def test_unloading_a_model_in_use_is_refused_even_without_asserts(repo):
    add_synthetic(repo, "m")
    cache = ModelCache(scan_repository(repo), {"cpu": 100 * MB})
    entry = await cache.acquire("m")
    with pytest.raises(IllegalTransition, match="1 request.s. in flight"):
        cache.unloads.start(entry, "evicted")
    assert entry.state is State.READY and cache.pools["cpu"].used == entry.account.size_bytes
    cache.release(entry)
    await asyncio.wait_for(cache.evict("m"), 5)
    assert entry.state is State.UNLOADED
    await cache.close()


async def test_a_download_is_the_downloading_phase_of_loading(repo, tmp_path):
    """A sourced model's pull (remote -> disk) is LOADING in phase ``downloading``, then
    LOADING without a phase (disk -> memory), then READY; a failed pull is FAILED with
    the pull's status remembered and no phase left over."""

    from agent.node.cache.disktier import DiskTier, PullError
    from agent.node.cache.lifecycle import Phase
    from tests.helpers import TINY_MLP
    from tests.standin_source import StandinSources
    from agent.modelzoo import write_mlp
    import yaml

    src = tmp_path / "src"
    for name in ("m", "down"):
        write_mlp(src / name / "1" / "model.onnx", **TINY_MLP)
        (repo / name).mkdir()
        (repo / name / "config.yaml").write_text(yaml.safe_dump({"source": f"file://{src / name}"}))
    sources = StandinSources()
    sources.delay[str(src / "m")] = 0.3
    cache = ModelCache({}, {"cpu": 100 * MB}, disk=functools.partial(
        DiskTier, tmp_path / "data" / "models", 10 * MB, policy="lru",
        open_source=sources.open_source))
    disk = cache.disk
    scan_repository(repo, disk.listing)
    await disk.refresh()
    cache.update_specs(scan_repository(repo, disk.listing))
    entry = cache.entry("m")
    seen = []
    task = asyncio.get_running_loop().create_task(cache.ensure_loaded("m"))
    while not task.done():
        seen.append((entry.state, entry.life.phase))
        await asyncio.sleep(0.01)
    await task
    assert (State.LOADING, Phase.DOWNLOADING) in seen
    assert seen.index((State.LOADING, Phase.DOWNLOADING)) < len(seen) - 1
    assert entry.state is State.READY and entry.life.phase is None
    sources.down.add(str(src / "down"))
    with pytest.raises(PullError) as err:
        await cache.acquire("down")
    failed = cache.entry("down")
    assert failed.state is State.FAILED and failed.life.phase is None
    assert err.value.status == 503 and failed.life.failed_status == 503
    with pytest.raises(LoadFailed) as again:  # remembered: no new pull for load_retry_s
        await cache.acquire("down")
    assert again.value.status == 503 and "unreachable" in str(again.value)
    assert len(sources.pulls) == 1
    await cache.close()
    await disk.close()
