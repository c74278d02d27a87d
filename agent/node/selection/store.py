"""What selection apps learned, in SQLite in ``$data_dir``: one row per (app, context)
with the members it was learned over and the policy's state as JSON. The apps write
behind (``SelectionApps.flush``, every ``write_every_s`` and at shutdown), so a restart
keeps what was learned and a crash loses at most the write interval. Blocking: called
in a thread, except the read of one context a request asks for."""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

#: The context key of an app's global state (contexts are request strings, never this).
GLOBAL = ""


class SelectionStore:
    """The SQLite file of learned states."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS states (app TEXT NOT NULL, "
                         "context TEXT NOT NULL, members TEXT NOT NULL, state TEXT NOT NULL, "
                         "PRIMARY KEY (app, context))")

    def read(self, app: str, context: str) -> tuple[list[str], dict[str, Any]] | None:
        """(members, state) saved for ``app``'s ``context`` (GLOBAL: its global state)."""
        with self._lock:
            row = self._db.execute("SELECT members, state FROM states WHERE app = ? AND "
                                   "context = ?", (app, context)).fetchone()
        return None if row is None else (json.loads(row[0]), json.loads(row[1]))

    def contexts(self, app: str) -> list[str]:
        with self._lock:
            rows = self._db.execute("SELECT context FROM states WHERE app = ? AND context "
                                    "!= ? ORDER BY context", (app, GLOBAL)).fetchall()
        return [r[0] for r in rows]

    def write(self, rows: list[tuple[str, str, list[str], dict[str, Any]]]) -> None:
        """Save (app, context, members, state) rows in one transaction."""
        if not rows:
            return
        with self._lock:
            self._db.execute("BEGIN")
            try:
                self._db.executemany(
                    "INSERT OR REPLACE INTO states (app, context, members, state) VALUES "
                    "(?, ?, ?, ?)", [(a, c, json.dumps(m), json.dumps(s))
                                     for a, c, m, s in rows])
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def delete(self, app: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM states WHERE app = ?", (app,))

    def close(self) -> None:
        with self._lock:
            self._db.close()
