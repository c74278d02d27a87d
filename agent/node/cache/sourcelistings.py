"""The sourced models' sources and what the disk tier remembers of them in
``<root>/.tier.json``: each model's version listing (listed off the event loop,
``refresh``), and each version's last download seconds, bytes and digest, so that a
restart with a source down still knows them. Writes are atomic; of writes that overlap,
the newest snapshot is the one left on disk."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from agent.config import ModelConfig
from agent.errors import AgentError
from agent.memory import write_atomic
from agent.node.repository import Listing

log = logging.getLogger("edgeagent.disk")

Key = tuple[str, int]
STATE_FILE = ".tier.json"
#: Listings under way at once (one per model; each source bounds its own time).
MAX_LISTINGS = 64


@dataclass
class SourceRef:
    """A sourced model's source: its config's URL and options, opened (no I/O)."""

    url: str
    options: dict[str, Any]
    source: Any  # agent.sources.Source
    display_url: str
    digest: str | None = None  # the config's pinned digest of the version it serves


def default_open_source(url: str, options: dict[str, Any]) -> Any:
    from agent.sources import open_source

    return open_source(url, options)


class SourceListings:
    """The sources of the sourced models, their listings and their pulls' records."""

    def __init__(self, root: Path, executor: concurrent.futures.Executor, *,
                 open_source: Callable[[str, dict], Any] = default_open_source,
                 wall_clock: Callable[[], float]) -> None:
        self.root, self.executor = root, executor
        self.open_source, self.wall_clock = open_source, wall_clock
        self.sources: dict[str, SourceRef] = {}
        #: Listings run here, off the pulls' threads (``MAX_LISTINGS`` at once).
        self.list_executor = concurrent.futures.ThreadPoolExecutor(MAX_LISTINGS,
                                                                   "edgeagent-list")
        self._under_way: dict[str, asyncio.Task] = {}  # the listing under way per model
        self.saved = self._read()
        #: ``.tier.json`` snapshots taken and the newest written (``persist``).
        self._snapshots = self._written = 0
        self._write_lock = threading.Lock()

    def _read(self) -> dict[str, Any]:
        path = self.root / STATE_FILE
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return data if isinstance(data.get("models"), dict) else {"models": {}}
        except (OSError, ValueError, AttributeError):
            return {"models": {}}

    def of(self, name: str) -> dict[str, Any]:
        """What is remembered of model ``name`` (made empty when new)."""
        return self.saved["models"].setdefault(name, {})

    def _version_field(self, key: Key, what: str) -> Any:
        return self.saved["models"].get(key[0], {}).get(what, {}).get(str(key[1]))

    async def persist(self) -> None:
        """Write the listings, download seconds and digests (``.tier.json``), off the loop;
        of writes that overlap, the newest snapshot is the one left on disk."""
        self._snapshots += 1
        snapshot, text = self._snapshots, json.dumps(self.saved, sort_keys=True)
        await asyncio.get_running_loop().run_in_executor(self.executor, self._write,
                                                         snapshot, text)

    def _write(self, snapshot: int, text: str) -> None:
        path = self.root / STATE_FILE
        with self._write_lock:
            if snapshot < self._written:
                return  # a newer snapshot is on disk already
            try:
                write_atomic(path, text)
                self._written = snapshot
            except OSError as exc:
                log.warning("disk tier: cannot write %s: %s", path, exc)

    # -- listings ----------------------------------------------------------------------
    def _source(self, name: str, config: ModelConfig) -> SourceRef:
        """The model's opened source (re-opened when its URL or options change)."""
        options = dict(config.source_options or {})
        ref = self.sources.get(name)
        if ref is None or ref.url != config.source or ref.options != options:
            source = self.open_source(config.source, options)
            ref = SourceRef(config.source, options, source, source.display_url)
            self.sources[name] = ref
        ref.digest = config.digest
        return ref

    def listing(self, name: str, config: ModelConfig, where: Path) -> Listing:
        """A sourced model's versions as known now (no I/O): the last listing, kept on
        disk; the repository scan calls it (``agent.node.repository.Listings``)."""
        root = self.root / name
        try:
            ref = self._source(name, config)
        except AgentError as exc:  # a source's own error: a bad URL or option (400)
            self.sources.pop(name, None)
            return Listing((), root, error=f"{where}: source: {exc}")
        state = self.of(name)
        if state.get("source") != ref.display_url:
            state.clear()
            state["source"] = ref.display_url
        versions = tuple(sorted(state.get("versions") or ()))
        if config.version is not None and versions:
            if config.version not in versions:
                return Listing((), root, pending=(
                    f"model {name!r}: {ref.display_url} lists no version {config.version} "
                    f"(versions: {', '.join(map(str, versions))})"))
            versions = (config.version,)
        if versions:
            return Listing(versions, root)
        failed = state.get("listing_error")
        return Listing((), root, pending=(
            f"model {name!r}: listing {ref.display_url} failed: {failed}" if failed
            else f"model {name!r}: its versions are being listed from {ref.display_url}"))

    async def refresh(self, names: list[str] | None = None,
                      on_change: Callable[[list[str]], None] | None = None) -> list[str]:
        """List the sources (of ``names``, default all) in threads of their own (one
        listing per model at a time: a model's listing under way is joined), so a slow or
        endless source delays only its own models; returns the names whose listing
        changed, and tells ``on_change`` of them as they finish (a slow source does not
        hold the others' news back). A failure is kept as the model's listing error and
        leaves its last listing (and every other model) as it was."""
        loop = asyncio.get_running_loop()
        refs = {n: r for n, r in self.sources.items() if names is None or n in names}
        if not refs:
            return []
        tasks = {}
        for name, ref in refs.items():
            task = self._under_way.get(name)
            if task is None or task.done():
                task = self._under_way[name] = loop.create_task(self._list(name, ref))
            tasks[task] = name
        changed: list[str] = []
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            now = sorted(tasks[t] for t in done if t.result())
            if now:
                changed += now
                if on_change is not None:
                    on_change(now)
        await self.persist()
        return changed

    async def _list(self, name: str, ref: SourceRef) -> bool:
        """List one model's source; whether its listing (or its error) changed."""
        state = self.of(name)
        before = (state.get("versions"), state.get("listing_error"))
        try:
            versions = await asyncio.get_running_loop().run_in_executor(
                self.list_executor, ref.source.versions)
        except Exception as exc:  # noqa: BLE001 - any failure is the model's error
            state["listing_error"] = str(exc) if isinstance(exc, AgentError) \
                else f"{type(exc).__name__}"
            log.warning("disk tier: listing %s for %s failed: %s", ref.display_url,
                        name, state["listing_error"])
        else:
            state["versions"] = sorted(int(v) for v in versions)
            state.pop("listing_error", None)
        state["listed_at"] = self.wall_clock()
        return before != (state.get("versions"), state.get("listing_error"))

    def close(self) -> None:
        """Stop listing (a listing's thread ends at its source's own deadline)."""
        self.list_executor.shutdown(wait=False, cancel_futures=True)

    # -- what a pull left ----------------------------------------------------------------
    def record_pull(self, key: Key, seconds: float, size: int, digest: str | None) -> None:
        name, version = key
        self.of(name).setdefault("download_seconds", {})[str(version)] = seconds
        self.of(name).setdefault("bytes", {})[str(version)] = size
        self.of(name).setdefault("digests", {})[str(version)] = digest or None

    def digest(self, key: Key) -> str | None:
        """The digest ``key`` had when it was pulled (None: not known)."""
        return self._version_field(key, "digests")

    def download_seconds(self, key: Key) -> float:
        """The last measured download of ``key`` (0 before any)."""
        return float(self._version_field(key, "download_seconds") or 0.0)

    def pulled_bytes(self, key: Key) -> int:
        """The bytes the last pull of ``key`` wrote (0 before any)."""
        return int(self._version_field(key, "bytes") or 0)

    def listing_error(self, name: str) -> str | None:
        """Why ``name``'s last listing failed (None: it did not)."""
        return self.saved["models"].get(name, {}).get("listing_error")

    def describe(self) -> list[dict[str, Any]]:
        """Each sourced model's listing: ``[{model, source, versions, listed_at,
        listing_error}]`` (its display URL only; the error of its last listing)."""
        out = []
        for name, ref in sorted(self.sources.items()):
            state = self.of(name)
            out.append({"model": name, "source": ref.display_url,
                        "versions": list(state.get("versions") or ()),
                        "listed_at": state.get("listed_at"),
                        "listing_error": state.get("listing_error")})
        return out
