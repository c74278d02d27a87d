"""A ``file://`` model source for the disk tier's tests, with the API of
``agent.sources`` (``open_source(url, options) -> Source``: ``display_url``,
``versions``, ``files``, ``pull``): a directory holding ``<version>/<files>``, copied
into a partial directory, checked against its listing and renamed into place.

``StandinSources`` opens them and lets a test make a source slow (seconds per pull),
hold its pulls until an event is set (``hold``), unreachable (``down``) or count its
pulls; ``secret`` is a credential carried in the
URL's user part, which ``display_url`` leaves out (the sentinel tests look for it)."""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from agent.sources import PullResult, RemoteFile, SourceError, SourceNotFound, SourceUnavailable


@dataclass
class StandinSources:
    """``open_source`` for the tests; what each source directory does, by its path."""

    delay: dict[str, float] = field(default_factory=dict)  # seconds per pull
    hold: dict[str, threading.Event] = field(default_factory=dict)  # a pull waits for it
    down: set[str] = field(default_factory=set)
    pulls: list[tuple[str, int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def open_source(self, url: str, options: dict) -> "StandinSource":
        parts = urlsplit(url)
        if parts.scheme != "file":
            raise SourceError(f"the stand-in opens file:// URLs only, not "
                                f"{parts.scheme}://")
        unknown = set(options) - {"note"}
        if unknown:
            raise SourceError(f"unknown source option {sorted(unknown)[0]!r}")
        return StandinSource(self, Path(parts.path), f"file://{parts.hostname or ''}"
                             f"{parts.path}")


class StandinSource:
    def __init__(self, owner: StandinSources, root: Path, display_url: str) -> None:
        self.owner, self.root, self.display_url = owner, root, display_url

    def _check(self) -> None:
        if str(self.root) in self.owner.down or not self.root.is_dir():
            raise SourceUnavailable(f"{self.display_url} is unreachable")

    def versions(self) -> list[int]:
        self._check()
        return sorted(int(p.name) for p in self.root.iterdir() if p.name.isdigit())

    def files(self, version: int) -> list[RemoteFile]:
        self._check()
        base = self.root / str(version)
        if not base.is_dir():
            raise SourceNotFound(f"{self.display_url} has no version {version}")
        return [RemoteFile(str(f.relative_to(base)), f.stat().st_size,
                           "sha256:" + hashlib.sha256(f.read_bytes()).hexdigest())
                for f in sorted(base.rglob("*")) if f.is_file()]

    def pull(self, version: int, dest: Path, progress=None, stop=None,
             bandwidth_bps=None, allowance=None) -> PullResult:  # no archives: no allowance
        started = time.monotonic()
        files = self.files(version)
        with self.owner.lock:
            self.owner.pulls.append((str(self.root), version))
        partial = dest.with_name(dest.name + ".partial")
        partial.mkdir(parents=True, exist_ok=True)
        total = sum(f.size for f in files)
        done = 0
        delay = self.owner.delay.get(str(self.root), 0.0)
        for f in files:
            if stop is not None and stop.is_set():
                raise SourceUnavailable("pull stopped")
            self._check()
            target = partial / f.path
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.root / str(version) / f.path, target)
            done += f.size
            if progress is not None:
                progress(done, total)
        if delay:
            time.sleep(delay)
        gate = self.owner.hold.get(str(self.root))
        if gate is not None:
            gate.wait(60)
        self._check()
        os.replace(partial, dest)
        return PullResult(version, total, time.monotonic() - started, "")
