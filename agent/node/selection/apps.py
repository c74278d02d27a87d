"""The node's selection apps: the repository's ``backend: selection`` entries by name,
their feedback, their learned states written behind to ``$data_dir`` (SQLite), and
what inspection and the CLI see. The front desk (``agent.node.frontdesk``) hands an
app's requests to its app instead of to a model."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from agent.backends.base import InvalidInput
from agent.node.cache import UnknownModel
from agent.node.repository import ModelSpec
from agent.node.selection.app import SelectionApp, parse_candidate
from agent.node.selection.store import SelectionStore

if TYPE_CHECKING:
    from agent.node.serving import Serving

log = logging.getLogger("edgeagent.selection")

#: Feedback items one request may carry at most.
MAX_FEEDBACK_ITEMS = 10_000


def split_apps(specs: dict[str, ModelSpec]) -> tuple[dict[str, ModelSpec],
                                                     dict[str, ModelSpec]]:
    """(the models the cache serves, the selection apps) of a repository scan."""
    apps = {n: s for n, s in specs.items() if s.backend == "selection" and s.error is None}
    return {n: s for n, s in specs.items() if n not in apps}, apps


class SelectionApps:
    """Every app of the node, their store and write-behind."""

    def __init__(self, serving: Serving, data_dir: Path, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.serving, self.clock = serving, clock
        self.store_path = data_dir / "selection.sqlite"
        self._store: SelectionStore | None = None
        self.apps: dict[str, SelectionApp] = {}
        self._writer: asyncio.Task | None = None

    @property
    def store(self) -> SelectionStore | None:
        """The SQLite store, opened when the first app needs it (None if it cannot be)."""
        if self._store is None:
            try:
                self._store = SelectionStore(self.store_path)
            except Exception as exc:  # noqa: BLE001 - sqlite3 or OSError: serve unpersisted
                log.error("cannot open %s, learned state is not kept: %s", self.store_path,
                          exc)
        return self._store

    def app(self, name: str, version: int | None = None) -> SelectionApp:
        app = self.apps.get(name)
        if app is None:
            raise UnknownModel(f"no selection app {name!r}")
        if version not in (None, 1):
            raise UnknownModel(f"app {name!r} has no version {version} (apps have version 1)")
        return app

    def update(self, apps: dict[str, ModelSpec], models: dict[str, ModelSpec]) -> None:
        """Take a rescan: new apps start, changed apps restart (their learned state is
        written first and read back), gone apps go; an app naming a model the
        repository lacks, or another app, keeps the reason as its error."""
        for name in list(self.apps):
            old = self.apps[name]
            if name not in apps or apps[name].config != old.spec.config:
                self._write_now(old.rows_to_write())
                del self.apps[name]
        for name, spec in apps.items():
            app = self.apps.get(name)
            if app is None:
                app = self.apps[name] = SelectionApp(spec, store=self.store, clock=self.clock)
            app.error, keys = None, []
            for text in spec.config.selection.candidates:  # type: ignore[union-attr]
                member, version = parse_candidate(text)
                if member in apps:
                    app.error = (f"app {name!r}: candidate {text!r} is a selection app; "
                                 "members must be models")
                elif member not in models:
                    app.error = f"app {name!r}: candidate {text!r} is not in the repository"
                elif models[member].error or not models[member].versions:
                    app.error = (f"app {name!r}: candidate {text!r} cannot serve: "
                                 f"{models[member].error or 'no version'}")
                elif version is None or version in models[member].versions:
                    keys.append(f"{member}:{version or models[member].default_version}")
                else:
                    app.error = f"app {name!r}: candidate {text!r}: {member} has no version " \
                                f"{version}"
            if app.error is None:
                app.bind(keys)

    # -- requests -----------------------------------------------------------------------
    def feedback(self, name: str, doc: Any) -> dict[str, Any]:
        """Apply a feedback body (one item, or ``{"feedback": [items]}``): every item is
        checked before any is learned, so a bad body changes nothing."""
        app = self.app(name)
        if not isinstance(doc, dict):
            raise InvalidInput("feedback must be a JSON object: {\"id\": ..., \"labels\": "
                               "[...]} or {\"feedback\": [...]}")
        if "feedback" in doc:
            items = doc["feedback"]
            if set(doc) != {"feedback"} or not isinstance(items, list):
                raise InvalidInput("a batch of feedback is {\"feedback\": [items]} and "
                                   "nothing else")
            if len(items) > MAX_FEEDBACK_ITEMS:
                raise InvalidInput(f"at most {MAX_FEEDBACK_ITEMS} feedback items per "
                                   f"request, got {len(items)}")
            where = [f"feedback[{i}]" for i in range(len(items))]
        else:
            items, where = [doc], ["feedback"]
        checked = [app.check_feedback(item, w) for item, w in zip(items, where)]
        unknown = [rid for rid, labels, losses, context in checked
                   if not app.learn(rid, labels, losses, context)]
        return {"accepted": len(checked) - len(unknown), "unknown_ids": unknown}

    # -- persistence --------------------------------------------------------------------
    def start(self) -> None:
        self._writer = asyncio.get_running_loop().create_task(self._write_behind())

    async def _write_behind(self) -> None:
        every = min((a.options.write_every_s for a in self.apps.values()), default=2.0)
        while True:
            await asyncio.sleep(every)
            rows = [r for app in self.apps.values() for r in app.rows_to_write()]
            if rows:
                await asyncio.get_running_loop().run_in_executor(None, self._write_now, rows)

    def _write_now(self, rows: list) -> None:
        store = self.store if rows else None
        if store is None:
            return
        try:
            store.write(rows)
        except Exception as exc:  # noqa: BLE001 - a full disk must not stop serving
            log.error("cannot write learned selection state to %s: %s", self.store_path, exc)

    async def close(self) -> None:
        """Stop writing behind and write what is left (shutdown)."""
        if self._writer is not None:
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
        self._write_now([r for app in self.apps.values() for r in app.rows_to_write()])
        if self._store is not None:
            self._store.close()
            self._store = None

    # -- inspection ---------------------------------------------------------------------
    def listing(self) -> list[dict[str, Any]]:
        return [self.apps[n].describe() for n in sorted(self.apps)]

    def reset(self, name: str) -> dict[str, Any]:
        app = self.app(name)
        app.reset()
        store = self.store
        if store is not None:
            store.delete(name)
        return app.describe()

    def contexts(self, name: str) -> list[str]:
        app = self.app(name)
        saved = self.store.contexts(name) if self.store else []
        return sorted(set(saved) | set(app.contexts))
