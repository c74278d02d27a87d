"""The coordinator's rollouts: started by ``POST /v1/rollouts`` or by a catalog entry
whose version changes, stepped (``rollout.step``) by the coordinator that plans every
``rollout_check_s``, and kept in the store, so that a restarted coordinator, or another
one sharing the PostgreSQL store, goes on at the same wave.

Every coordinator serves the version table (``versions.VersionTable``) of the catalog,
the rollouts under way and the versions marked bad, rebuilt whenever the store says
one of them changed (``Store.version_state``), and hands it to its report workers.

On a breach the rollout is ``rolled_back``: the catalog entry goes back to the old
version and the new one is marked bad, in one transaction; the nodes of the waves that
switched go back with their next answer. An operator's ``abort`` does the same without
marking the version bad. A version marked bad is served by no node and refused by the
catalog and ``POST /v1/rollouts`` until an operator clears it
(``DELETE /v1/models/{name}/bad-versions/{version}``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import orjson

from agent.coordinator.catalog import CatalogError, ModelSLO, rollout_settings
from agent.coordinator.rollout import (ABORTED, PAUSED, ROLLED_BACK, RUNNING, Counters,
                                       NodeView, Rollout, new_rollout, step)
from agent.coordinator.rolloutstore import RolloutConflict
from agent.coordinator.versions import VersionTable, build_table
from agent.errors import AgentError

if TYPE_CHECKING:
    from agent.coordinator.app import Coordinator

log = logging.getLogger("edgeagent.coordinator.rollouts")


class RolloutNotFound(AgentError):
    status = 404


class FleetRollouts:
    """One coordinator's side of the rollouts (see the module docstring)."""

    def __init__(self, co: "Coordinator") -> None:
        self.co = co
        self._ids = itertools.count(1)
        self._seen: tuple | None = None
        self.table = VersionTable()
        self.refresh_step()
        co.fleet.set_versions(self.table)

    # -- the version table ------------------------------------------------------------
    def refresh_step(self, force: bool = False) -> bool:
        """(In a worker thread) rebuild the table when the store says the catalog, a
        rollout or a bad version changed; whether it did."""
        store = self.co.store
        seen = store.version_state()
        if seen == self._seen and not force:
            return False
        self.table = build_table(next(self._ids), store.models(),
                                 store.rollouts(active=True), store.bad_versions())
        self._seen = seen
        return True

    async def refresh(self, force: bool = False) -> None:
        """Serve the table as the store has it now, here and in the report workers."""
        if await asyncio.get_running_loop().run_in_executor(None, self.refresh_step, force):
            self.co.fleet.set_versions(self.table)
            await self.co.workers.push_versions(self.table)

    # -- what the nodes report --------------------------------------------------------
    def _nodes_of(self, model: str) -> list[str]:
        """The nodes the current plan runs ``model`` on, then those reporting it."""
        plan = self.co.fleet.plan
        placed = ((plan.plan.get("models") or {}).get(model) or {}).get("placement") \
            if plan is not None else None
        nodes = set(placed or {})
        for state in self.co.fleet.nodes.values():
            if any(name == model for name, _ in state.models):
                nodes.add(state.name)
        return sorted(nodes)

    def view(self, model: str, nodes: list[str]) -> dict[str, NodeView]:
        """(In a worker thread) what ``nodes`` last reported of ``model`` (the store's
        rows: every coordinator sharing it writes there)."""
        now, timeout = self.co.clock(), self.co.config.node_timeout_s
        out = {}
        for name, last_seen, report in self.co.store.node_reports(nodes):
            stats = (orjson.loads(report).get("version_stats") or {}).get(model) or []
            alive = now - last_seen <= timeout
            out[name] = NodeView(
                alive=alive,
                serving=next((s["version"] for s in stats if s.get("serving")), None),
                versions={s["version"]: Counters.from_json(
                    {**s, "buckets": s.get("latency_buckets") or ()}) for s in stats},
                errors={s["version"]: s["error"] for s in stats if s.get("error")})
        return out

    # -- starting -----------------------------------------------------------------------
    def _start_step(self, model: str, to: tuple[int, str | None], given: Any,
                    entry: ModelSLO | None = None) -> Rollout:
        """(In a worker thread) start rolling ``model`` to ``to`` with ``given``
        settings over the entry's and the config's; ``entry``: the catalog entry to put
        with it (a PUT's), else the stored one with the new version."""
        store, co = self.co.store, self.co
        current = store.model(model)
        if current is None:
            raise RolloutNotFound(f"model {model!r} is not in the catalog")
        if current.source is None or current.version is None:
            raise CatalogError(f"model {model!r} has no source and version in the catalog "
                               "to roll out from: PUT /v1/models/{name} with source and "
                               "version first")
        check_not_bad(store, model, to[0])
        if (current.version, current.digest) == to:
            raise CatalogError(f"model {model!r} serves version {to[0]} already")
        base, own = co.config.rollout, (entry or current).rollout
        if own:  # the entry's own settings (a PUT's, as it puts them)
            base = rollout_settings(own, "rollout", base)
        settings = rollout_settings(given or {}, "rollout", base)
        nodes = self._nodes_of(model)
        view = self.view(model, nodes)
        now = co.clock()
        updated = entry or replace(current, version=to[0], digest=to[1])

        def make(rollout_id: int) -> Rollout:
            return new_rollout(rollout_id, model, (current.version, current.digest), to,
                               settings, nodes, view, current.percentile, now)

        rollout = store.start_rollout(make, updated, now)
        log.info("rollout %d of %s: version %s -> %s in %d waves %s", rollout.id, model,
                 current.version, to[0], len(rollout.waves),
                 [list(w) for w in rollout.waves])
        self.refresh_step(force=True)
        return rollout

    async def start(self, model: str, to: tuple[int, str | None], given: Any = None,
                    entry: ModelSLO | None = None) -> Rollout:
        rollout = await asyncio.get_running_loop().run_in_executor(
            None, self._start_step, model, to, given, entry)
        self.co.fleet.set_versions(self.table)
        await self.co.workers.push_versions(self.table)
        return rollout

    def catalog_change(self, before: ModelSLO | None, after: ModelSLO) -> bool:
        """Whether ``PUT`` of ``after`` over ``before`` moves the version nodes serve:
        then it rolls out (``start`` with ``entry=after``) instead of reaching every node
        at once. A first version (nothing served by one before) is no rollout."""
        return before is not None and before.source is not None \
            and before.version is not None and after.source is not None \
            and after.version is not None \
            and (after.version, after.digest) != (before.version, before.digest)

    # -- the operator's moves -----------------------------------------------------------
    def _move_step(self, rollout_id: int, move: str) -> Rollout:
        store, now = self.co.store, self.co.clock()
        for _ in range(3):  # another coordinator's step may win the race: look again
            r = store.rollout(rollout_id)
            if r is None:
                raise RolloutNotFound(f"no rollout {rollout_id}")
            allowed = {"pause": (RUNNING,), "resume": (PAUSED,), "abort": (RUNNING, PAUSED)}
            if r.state not in allowed[move]:
                raise RolloutConflict(f"rollout {rollout_id} is {r.state}: it cannot "
                                      f"{move} (only a rollout "
                                      f"{' or '.join(allowed[move])})")
            if move == "pause":
                nxt = r.paused(now)
            elif move == "resume":
                nxt = r.resumed(now)
            else:
                nxt = r.aborted(now, "aborted by an operator")
            if self._end_step(r, nxt):
                return nxt
        raise RolloutConflict(f"rollout {rollout_id} keeps changing; try again")

    async def move(self, rollout_id: int, move: str) -> Rollout:
        rollout = await asyncio.get_running_loop().run_in_executor(
            None, self._move_step, rollout_id, move)
        await self.refresh(force=True)
        return rollout

    def _end_step(self, r: Rollout, nxt: Rollout) -> bool:
        """Store ``nxt`` over ``r`` (unless it changed meanwhile: False); a rollout
        that ends rolled back or aborted puts the catalog back to the old version, a
        rollback marks the new one bad."""
        store = self.co.store
        slo = bad = None
        if nxt.state in (ROLLED_BACK, ABORTED) and r.state not in (ROLLED_BACK, ABORTED):
            current = store.model(r.model)
            if current is not None and (current.version, current.digest) == (
                    r.to_version, r.to_digest):
                slo = replace(current, version=r.from_version, digest=r.from_digest)
            if nxt.state == ROLLED_BACK:
                bad = (r.model, r.to_version, r.to_digest,
                       f"rollout {r.id}: {nxt.reason}")
        if not store.save_rollout(nxt, was=r.updated, slo=slo, bad=bad):
            return False
        if nxt.state != r.state or nxt.wave != r.wave or nxt.phase != r.phase:
            log.log(logging.WARNING if nxt.state == ROLLED_BACK else logging.INFO,
                    "rollout %d of %s (%s -> %s): %s, wave %d/%d %s%s", nxt.id, nxt.model,
                    nxt.from_version, nxt.to_version, nxt.state, nxt.wave + 1,
                    len(nxt.waves), nxt.phase, f": {nxt.reason}" if nxt.reason else "")
        return True

    # -- the planning coordinator's loop -------------------------------------------------
    def step_all(self) -> bool:
        """(In a worker thread) step every running rollout once; whether any changed
        which version a node serves."""
        moved = False
        for r in self.co.store.rollouts(active=True):
            if r.state != RUNNING:
                continue
            nodes = sorted({n for wave in r.waves for n in wave}
                           | set(self._nodes_of(r.model)))
            nxt = step(r, self.view(r.model, nodes), self.co.clock())
            if nxt is r:
                continue
            if self._end_step(r, nxt):
                moved |= nxt.state != r.state or nxt.wave != r.wave
        return moved

    async def run(self) -> None:
        """While this coordinator plans: step the rollouts every ``rollout_check_s``."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.co.config.rollout_check_s)
            if not self.co.leader:
                continue
            try:
                if await loop.run_in_executor(None, self.step_all):
                    await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the next look tries again
                log.exception("stepping the rollouts failed")


def check_not_bad(store: Any, model: str, version: int | None) -> None:
    """``RolloutConflict`` (409) when ``model:version`` is marked bad."""
    if version is None:
        return
    for row in store.bad_versions(model):
        if row["version"] == version:
            raise RolloutConflict(
                f"version {version} of {model!r} is marked bad ({row['reason']}); an "
                f"operator clears it with DELETE /v1/models/{model}/bad-versions/{version} "
                f"or 'edgeagent coordinator rollout clear {model} {version}'")
