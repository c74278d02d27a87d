"""A throwaway PostgreSQL cluster for tests: ``initdb`` in a temporary directory, no TCP
listener, only a unix socket in that directory (so clusters of parallel test processes
never share an address), ``pg_ctl`` to stop and start it. As root (CI, this box) the
server runs as ``nobody``: postgres refuses to run as root."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path


def find_bindir() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``: PATH, else the newest
    /usr/lib/postgresql/*/bin (Debian's packages keep them off PATH)."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        return Path(on_path).parent
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parent.parent.name)
                   if Path(p).parent.parent.name.isdigit() else 0)
    return Path(found[-1]).parent if found else None


class Cluster:
    """One cluster in ``root`` (started by ``start``)."""

    def __init__(self, bindir: Path, root: Path) -> None:
        self.bindir, self.root = bindir, root
        self.data, self.log = root / "data", root / "server.log"
        self.as_user = ["runuser", "-u", "nobody", "--"] if os.geteuid() == 0 else []
        self._databases = 0

    def _run(self, *args: str) -> None:
        subprocess.run([*self.as_user, *args], check=True, capture_output=True,
                       timeout=120)

    def init(self) -> "Cluster":
        self.root.mkdir(parents=True, exist_ok=True)
        if self.as_user:
            shutil.chown(self.root, "nobody")
        self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres",
                  "-A", "trust", "-E", "UTF8", "--no-sync")
        return self

    def start(self) -> None:
        # fsync off: a test cluster; a fast stop still writes everything committed
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log),
                  "-w", "-t", "60", "-o",
                  f"-k {self.root} -c listen_addresses='' "
                  "-c fsync=off -c max_connections=200", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w",
                  "stop")

    def start_if_stopped(self) -> None:
        status = subprocess.run([*self.as_user, str(self.bindir / "pg_ctl"), "-D",
                                 str(self.data), "status"], capture_output=True)
        if status.returncode != 0:
            self.start()

    def url(self, db: str = "postgres") -> str:
        return f"postgresql://postgres@/{db}?host={self.root}"

    def new_database(self) -> str:
        """A fresh, empty database; its URL."""
        import psycopg

        self._databases += 1
        name = f"t{self._databases}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)
