"""The store's rollouts (``agent.coordinator.rollout``) and the versions they marked bad
(migration 8): a part of ``Store`` (SQLite and PostgreSQL alike), which gives it its
transactions (``_tx``), queries (``_query``) and catalog writes (``_put_model``).

A model has at most one rollout under way (running or paused: a partial unique index),
and a rollout is saved only over the version of it its writer read (``was``): two
coordinators never both move one rollout.
"""

from __future__ import annotations

from typing import Any, Callable

import orjson

from agent.coordinator.catalog import ModelSLO
from agent.coordinator.rollout import ACTIVE, Rollout
from agent.errors import AgentError


class RolloutConflict(AgentError):
    """A rollout of a model that has one under way already: 409."""

    status = 409


class RolloutRecords:
    """Rollouts and bad versions in the store's database."""

    _tx: Callable[[], Any]
    _query: Callable[..., list[tuple]]
    _put_model: Callable[[Any, ModelSLO, float], bool]

    def start_rollout(self, make: Callable[[int], Rollout], slo: ModelSLO, now: float
                      ) -> Rollout:
        """In one transaction: the rollout ``make(id)`` builds stored, and the catalog
        entry ``slo`` (naming the version rolled out) put; ``RolloutConflict`` when the
        model has one under way (nothing changes)."""
        conflict = RolloutConflict(f"model {slo.name!r} has a rollout under way: pause, "
                                   "abort or wait for it (GET /v1/rollouts)")
        try:
            with self._tx() as db:
                if db.execute("SELECT 1 FROM rollouts WHERE model = ? AND state IN "
                              "(?, ?)", (slo.name, *ACTIVE)).fetchone() is not None:
                    raise conflict
                rollout_id = int(db.execute(
                    "INSERT INTO rollouts (model, state, doc, created, updated) "
                    "VALUES (?, ?, '{}', ?, ?) RETURNING id",
                    (slo.name, ACTIVE[0], now, now)).fetchone()[0])
                rollout = make(rollout_id)
                db.execute("UPDATE rollouts SET state = ?, doc = ?, updated = ? "
                           "WHERE id = ?", (rollout.state, orjson.dumps(
                               rollout.to_json()).decode(), now, rollout_id))
                self._put_model(db, slo, now)
                return rollout
        except RolloutConflict:
            raise
        except Exception as exc:  # noqa: BLE001 - the one-active index: another won
            if "rollouts_one_active" in str(exc) or "UNIQUE" in str(exc):
                raise conflict from None
            raise

    def save_rollout(self, rollout: Rollout, *, was: float | None = None,
                     slo: ModelSLO | None = None,
                     bad: tuple[str, int, str | None, str] | None = None) -> bool:
        """Store ``rollout`` as it is now, where the stored one was last updated at
        ``was`` (None: whatever it was); with ``slo``, the catalog entry put (a
        rollback's old version) and with ``bad`` (model, version, digest, reason) that
        version marked bad, in the same transaction. False (nothing written) when the
        stored rollout changed since ``was``."""
        with self._tx() as db:
            sql = "UPDATE rollouts SET state = ?, doc = ?, updated = ? WHERE id = ?"
            args: tuple = (rollout.state, orjson.dumps(rollout.to_json()).decode(),
                           rollout.updated, rollout.id)
            if was is not None:
                sql, args = sql + " AND updated = ?", (*args, was)
            if db.execute(sql, args).rowcount == 0:
                return False
            if slo is not None:
                self._put_model(db, slo, rollout.updated)
            if bad is not None:
                db.execute("INSERT INTO bad_versions (model, version, digest, reason, "
                           "rollout, marked) VALUES (?, ?, ?, ?, ?, ?) "
                           "ON CONFLICT(model, version) DO UPDATE SET "
                           "digest = excluded.digest, reason = excluded.reason, "
                           "rollout = excluded.rollout, marked = excluded.marked",
                           (*bad, rollout.id, rollout.updated))
            return True

    def rollouts(self, *, active: bool = False, model: str | None = None,
                 limit: int = 100) -> list[Rollout]:
        """Rollouts, newest first: only those under way (``active``), of ``model``."""
        where, args = [], []
        if active:
            where.append("state IN (?, ?)")
            args += list(ACTIVE)
        if model is not None:
            where.append("model = ?")
            args.append(model)
        sql = "SELECT doc FROM rollouts" + (f" WHERE {' AND '.join(where)}" if where
                                             else "") + " ORDER BY id DESC LIMIT ?"
        return [Rollout.from_json(orjson.loads(doc))
                for (doc,) in self._query(sql, (*args, limit))]

    def rollout(self, rollout_id: int) -> Rollout | None:
        rows = self._query("SELECT doc FROM rollouts WHERE id = ?", (rollout_id,))
        return Rollout.from_json(orjson.loads(rows[0][0])) if rows else None

    def version_state(self) -> tuple:
        """Changes whenever the catalog, a rollout or a bad version changes (cheap: to
        notice what another coordinator did)."""
        return tuple(self._query(
            "SELECT (SELECT COUNT(*) FROM models), (SELECT MAX(updated) FROM models), "
            "(SELECT COUNT(*) FROM rollouts), (SELECT MAX(updated) FROM rollouts), "
            "(SELECT COUNT(*) FROM bad_versions), (SELECT MAX(marked) FROM bad_versions)")[0])

    def bad_versions(self, model: str | None = None) -> list[dict[str, Any]]:
        """The versions marked bad (of ``model``): model, version, digest, reason,
        rollout, marked."""
        sql = "SELECT model, version, digest, reason, rollout, marked FROM bad_versions"
        rows = self._query(sql + " WHERE model = ? ORDER BY version", (model,)) \
            if model is not None else self._query(sql + " ORDER BY model, version")
        return [dict(zip(("model", "version", "digest", "reason", "rollout", "marked"), r))
                for r in rows]

    def clear_bad_version(self, model: str, version: int) -> bool:
        """An operator clears ``model:version``: offered again."""
        with self._tx() as db:
            return db.execute("DELETE FROM bad_versions WHERE model = ? AND version = ?",
                              (model, version)).rowcount > 0
