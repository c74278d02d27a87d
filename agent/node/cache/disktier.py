"""The disk tier: the files of sourced models (``source:`` in a model's config.yaml),
pulled into ``<data_dir>/models/<name>/<version>/`` within ``disk_budget``.

It is the middle tier of the miss path remote → disk → memory. ``ensure`` pulls a
version that is not on disk (one pull per model version at a time: every caller awaits
the same task; at most ``max_concurrent_pulls`` run at once). Room is kept with the
simulator's books (``cachepolicies.pool.MemoryPool``) and a ``cachepolicies`` policy
whose penalty is each version's measured download seconds, so a slow download is kept
over a fast one. Victims are first the versions not in memory; only when those do not
make room, the files of versions resident in memory (they keep serving; their files are
pulled again only if they must reload). Nothing pinned, loading or pulling is evicted.
A pull that finds no room now (the budget held by pulls under way and by versions
loading) waits in the tier's room queue, as a load waits for memory: granted in
deadline-then-arrival order when a pull or a load ends, by its model's
``load_wait_max_s`` (``DiskBusy``, 503 + Retry-After, after it). Files that can never fit
(more than the budget less the pinned versions, or than the file system could ever
free) and a full file system fail the pull with ``DiskFull`` (507) naming the model, the
bytes it needs and the bytes free, and evict nothing. A pull in flight is a window on
the memory tier's meter: a load measured meanwhile (its RSS counts the pull's buffers)
is booked at its estimate. A model whose config pins a ``digest`` gets only a version of
that digest (the pull's ``PullResult.digest``, kept in ``.tier.json`` with each
version): one that differs is removed and refused (502), naming both digests.

It also keeps each sourced model's version listing (``listing``), listed off the event
loop (``refresh``) and kept with the download seconds in ``.tier.json`` so that a restart
with the source down still knows them. At start it scans its directory: complete
version directories are holdings (a pull renames a version into place only once every
file is verified), anything else is a partial pull, kept for the next pull to resume
and never loaded.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import heapq
import itertools
import json
import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from cachepolicies.pool import MemoryPool
from cachepolicies.registry import make_policy

from agent.config import ModelConfig
from agent.errors import AgentError
from agent.memory import MemoryMeter, write_atomic
from agent.node.repository import Listing
from agent.node.cache.roomqueue import RoomRequest
from agent.sources.errors import DigestMismatch
from agent.units import format_size

log = logging.getLogger("edgeagent.disk")

Key = tuple[str, int]
STATE_FILE = ".tier.json"
TRASH = ".trash-"

#: What the memory tier does with a version, as the disk tier asks (``DiskTier.usage``):
#: ``pinned`` and ``reading`` (loading, or served by a runtime that reads its files) are
#: never evicted; ``resident`` (in memory, files not needed) only after every ``idle``.
USAGES = ("pinned", "reading", "resident", "idle")


class PullError(AgentError):
    """A pull failed; ``status`` and ``retry_after`` are its cause's (a source's 503 is
    retryable, a wrong digest 502, a missing version 404)."""

    status = 503

    def __init__(self, message: str, status: int = 503,
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status, self.retry_after = status, retry_after


class DiskFull(PullError):
    """The files can never fit: the disk, or the disk budget less what is pinned (507)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 507)


class DiskBusy(PullError):
    """A pull waited its model's ``load_wait_max_s`` for disk room that pulls and loads
    held (503 + Retry-After); nothing is remembered: the next request tries again."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 503, 1.0)


class NotSourced(AgentError):
    """``ensure``/``drop`` of a model the tier pulls nothing for (404)."""

    status = 404


@dataclass
class Pull:
    """A pull under way: its task and its progress (written by the pulling thread)."""

    key: Key
    task: asyncio.Task
    started: float  # wall clock
    done_bytes: int = 0
    total_bytes: int = 0


@dataclass
class SourceRef:
    """A sourced model's source: its config's URL and options, opened (no I/O)."""

    url: str
    options: dict[str, Any]
    source: Any  # agent.sources.Source
    display_url: str
    digest: str | None = None  # the config's pinned digest of the version it serves


def _free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


def _tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _default_open_source(url: str, options: dict[str, Any]) -> Any:
    from agent.sources import open_source

    return open_source(url, options)


class DiskTier:
    """Sourced models' files on this node's disk, under a byte budget."""

    def __init__(self, root: Path, budget: int | None = None, *, policy: str = "cremebrulee",
                 open_source: Callable[[str, dict], Any] = _default_open_source,
                 max_concurrent_pulls: int = 2, bandwidth: int | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time,
                 free_bytes: Callable[[Path], int] = _free_bytes) -> None:
        self.root = Path(root)  # made by the first pull
        self.open_source, self.bandwidth = open_source, bandwidth
        self.clock, self.wall_clock, self.free_bytes = clock, wall_clock, free_bytes
        self.max_concurrent_pulls = max_concurrent_pulls
        self._slots = asyncio.Semaphore(max_concurrent_pulls)
        self.executor = concurrent.futures.ThreadPoolExecutor(max_concurrent_pulls + 2, "edgeagent-pull")
        self._stop = threading.Event()
        self._trash_seq = itertools.count()
        #: Set by the memory tier: what it does with a version (one of ``USAGES``).
        self.usage: Callable[[Key], str] = lambda key: "idle"
        #: Set by the memory tier: seconds a pull of a version may wait for room.
        self.wait_bound: Callable[[Key], float] = lambda key: 30.0
        #: Set by the memory tier: its meter; a pull in flight is a window on it.
        self.meter: MemoryMeter | None = None
        #: Called as ``f(key, on_disk)`` when a version's files arrive or leave.
        self.on_change: list[Callable[[Key, bool], None]] = []
        self.waiting: list[RoomRequest] = []  # pulls waiting for room (a heap)
        self._room_seq = itertools.count()
        self.sources: dict[str, SourceRef] = {}
        self.pulls: dict[Key, Pull] = {}
        self.pulled = self.evicted = self.pull_failures = 0
        self.pulled_bytes = 0
        #: the last failure of each version's pull (cleared when one succeeds)
        self.errors: dict[Key, str] = {}
        self._state = self._read_state()
        #: ``.tier.json`` snapshots taken and the newest written (``persist``).
        self._snapshots = self._written = 0
        self._write_lock = threading.Lock()
        self.held: dict[Key, int] = self._scan()
        if budget is None:
            existing = next(p for p in (self.root, *self.root.parents) if p.exists())
            budget = (free_bytes(existing) + sum(self.held.values())) // 2
        self.pool = MemoryPool(budget, make_policy(policy))
        for key, size in self.held.items():  # as found, over the budget or not: the
            # next pull evicts down to it
            self.pool.commit(key, 0, size, self.download_seconds(key), clock())

    # -- start: what is on disk ------------------------------------------------------
    def _read_state(self) -> dict[str, Any]:
        path = self.root / STATE_FILE
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return data if isinstance(data.get("models"), dict) else {"models": {}}
        except (OSError, ValueError, AttributeError):
            return {"models": {}}

    def _scan(self) -> dict[Key, int]:
        """The complete versions on disk with their bytes; leftovers of evictions
        removed, partial pulls kept (never loaded) for a resume."""
        held: dict[Key, int] = {}
        if not self.root.is_dir():
            return held
        for model in sorted(self.root.iterdir()):
            if model.name.startswith(TRASH):
                shutil.rmtree(model, ignore_errors=True)
                continue
            if not model.is_dir() or model.name.startswith("."):
                continue
            for child in sorted(model.iterdir()):
                if child.is_dir() and child.name.isascii() and child.name.isdigit():
                    held[(model.name, int(child.name))] = _tree_bytes(child)
                else:
                    log.info("disk tier: %s/%s is a partial pull, kept for a resume",
                             model.name, child.name)
        if held:
            log.info("disk tier: %d version(s) on disk, %s", len(held),
                     format_size(sum(held.values())))
        return held

    def _model_state(self, name: str) -> dict[str, Any]:
        return self._state["models"].setdefault(name, {})

    async def persist(self) -> None:
        """Write the listings, download seconds and digests (``.tier.json``), off the loop;
        of writes that overlap, the newest snapshot is the one left on disk."""
        self._snapshots += 1
        snapshot, text = self._snapshots, json.dumps(self._state, sort_keys=True)
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
        state = self._model_state(name)
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

    async def refresh(self, names: list[str] | None = None) -> list[str]:
        """List the sources (of ``names``, default all) in threads; returns the names
        whose listing changed. A failure is kept as the model's listing error and leaves
        its last listing (and every other model) as it was."""
        loop = asyncio.get_running_loop()
        refs = {n: r for n, r in self.sources.items() if names is None or n in names}

        async def one(name: str, ref: SourceRef) -> bool:
            state = self._model_state(name)
            before = (state.get("versions"), state.get("listing_error"))
            try:
                versions = await loop.run_in_executor(self.executor, ref.source.versions)
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

        if not refs:
            return []
        changed = await asyncio.gather(*(one(n, r) for n, r in refs.items()))
        await self.persist()
        return [n for n, c in zip(refs, changed) if c]

    # -- holdings ------------------------------------------------------------------------
    def has(self, key: Key) -> bool:
        """``key``'s files are on disk (and of the digest its config pins, if any)."""
        return key in self.held and self._digest_ok(key)

    def digest(self, key: Key) -> str | None:
        """The digest ``key`` had when it was pulled (None: not known)."""
        return self._state["models"].get(key[0], {}).get("digests", {}).get(str(key[1]))

    def _digest_ok(self, key: Key) -> bool:
        ref = self.sources.get(key[0])
        return ref is None or ref.digest is None or self.digest(key) == ref.digest

    def download_seconds(self, key: Key) -> float:
        """The last measured download of ``key`` (0 before any)."""
        seconds = self._state["models"].get(key[0], {}).get("download_seconds", {})
        return float(seconds.get(str(key[1]), 0.0))

    def pulled_profile(self, key: Key) -> tuple[float, int]:
        """``key``'s last measured pull as its twin replays it: (download seconds, bytes
        on disk); its bytes now where it is on disk, else those its last pull wrote."""
        size = self.held.get(key)
        if size is None:
            size = self._state["models"].get(key[0], {}).get("bytes", {}).get(str(key[1]), 0)
        return self.download_seconds(key), int(size)

    def record_access(self, key: Key) -> None:
        """A request for ``key`` (the disk policy's request rates)."""
        self.pool.policy.record_access(key, self.clock())

    def holdings(self) -> list[dict[str, Any]]:
        """What is on disk: ``[{model, version, bytes, download_seconds, digest}]``."""
        return [{"model": n, "version": v, "bytes": size,
                 "download_seconds": round(self.download_seconds((n, v)), 6),
                 "digest": self.digest((n, v))}
                for (n, v), size in sorted(self.held.items())]

    def pulling(self) -> list[dict[str, Any]]:
        """Pulls under way: ``[{model, version, bytes, total_bytes, started}]``."""
        return [{"model": p.key[0], "version": p.key[1], "bytes": p.done_bytes,
                 "total_bytes": p.total_bytes, "started": p.started}
                for p in sorted(self.pulls.values(), key=lambda p: p.key)]

    def listings(self) -> list[dict[str, Any]]:
        """Each sourced model's listing: ``[{model, source, versions, listed_at,
        listing_error}]`` (its display URL only; the error of its last listing)."""
        out = []
        for name, ref in sorted(self.sources.items()):
            state = self._model_state(name)
            out.append({"model": name, "source": ref.display_url,
                        "versions": list(state.get("versions") or ()),
                        "listed_at": state.get("listed_at"),
                        "listing_error": state.get("listing_error")})
        return out

    def pull_errors(self) -> list[dict[str, Any]]:
        """Each version's last failed pull: ``[{model, version, error}]``."""
        return [{"model": n, "version": v, "error": e}
                for (n, v), e in sorted(self.errors.items())]

    def listing_error(self, name: str) -> str | None:
        """Why ``name``'s last listing failed (None: it did not)."""
        return self._state["models"].get(name, {}).get("listing_error")

    def progress(self, key: Key) -> dict[str, int] | None:
        pull = self.pulls.get(key)
        return None if pull is None else {"bytes": pull.done_bytes,
                                          "total_bytes": pull.total_bytes}

    def summary(self) -> dict[str, Any]:
        """The tier's figures (``/v1/disk``, ``/metrics``)."""
        return {"budget_bytes": self.pool.budget, "used_bytes": self.pool.used,
                "reserved_bytes": self.pool.reserved, "versions": len(self.held),
                "pulling": len(self.pulls), "waiting_pulls": len(self.waiting),
                "pulls": self.pulled,
                "pulled_bytes": self.pulled_bytes, "pull_failures": self.pull_failures,
                "evictions": self.evicted}

    # -- pulling ---------------------------------------------------------------------------
    async def ensure(self, name: str, version: int, *, loading: bool = False) -> None:
        """Pull ``name``'s ``version`` if it is not on disk (or is, of a digest other
        than its pinned one); every caller of a version being pulled awaits that one
        pull. ``PullError`` (``DiskFull``) when it fails. ``loading``: the caller is the
        version's own load, which has read none of its files yet."""
        key = (name, int(version))
        if name not in self.sources:
            if key in self.held:
                return
            raise NotSourced(f"model {name!r} has no source this node pulls from")
        if key in self.held:
            if self._digest_ok(key):
                return
            self._drop_other_digest(key, loading)
        pull = self.pulls.get(key)
        if pull is None:
            task = asyncio.get_running_loop().create_task(self._pull(key))
            pull = self.pulls[key] = Pull(key, task, self.wall_clock())
            task.add_done_callback(lambda t: self._pull_done(key, t))
        await asyncio.shield(pull.task)

    def _drop_other_digest(self, key: Key, loading: bool) -> None:
        """Take off disk ``key``'s files of a digest other than the pinned one, so that
        the pinned one is pulled; a 409 ``PullError`` while memory still uses them."""
        name, version = key
        found, want = self.digest(key), self.sources[name].digest
        if self.usage(key) != "idle" and not loading:
            raise PullError(f"model {name}:{version}: the files on disk have digest "
                            f"{found or 'unknown'} but its config pins {want}; they are "
                            "in use: unload the model to pull the pinned version", 409)
        log.info("disk tier: %s:%s on disk has digest %s, not the pinned %s: pulled again",
                 name, version, found or "unknown", want)
        self.pool.remove(key)
        self._delete(key)
        self.evicted += 1

    def _pull_done(self, key: Key, task: asyncio.Task) -> None:
        self.pulls.pop(key, None)
        if task.cancelled() or task.exception() is not None:
            self.pull_failures += 1
            if not task.cancelled():
                self.errors[key] = str(task.exception())
        else:
            self.errors.pop(key, None)
        self.wake()

    async def _pull(self, key: Key) -> None:
        name, version = key
        ref = self.sources[name]
        where = f"model {name}:{version}"
        loop = asyncio.get_running_loop()
        async with self._slots:
            try:
                files = await loop.run_in_executor(self.executor, ref.source.files, version)
            except Exception as exc:  # noqa: BLE001
                raise self._failure(where, ref, exc) from None
            need = sum(max(int(f.size), 0) for f in files)  # -1: the source does not say
            self.pulls[key].total_bytes = need
            self.root.mkdir(parents=True, exist_ok=True)
            await self._make_room(key, need)
            try:
                with self._in_flight():
                    seconds, size, digest = await self._download(key, ref, need)
            except BaseException:
                self.pool.cancel(need)
                raise
        self.pool.commit(key, need, size, seconds, self.clock())
        self.held[key] = size
        self.pulled += 1
        self.pulled_bytes += size
        self._model_state(name).setdefault("download_seconds", {})[str(version)] = seconds
        self._model_state(name).setdefault("bytes", {})[str(version)] = size
        self._model_state(name).setdefault("digests", {})[str(version)] = digest or None
        await self.persist()
        log.info("disk tier: pulled %s from %s: %s in %.3fs; disk %s/%s", where,
                 ref.display_url, format_size(size), seconds, format_size(self.pool.used),
                 format_size(self.pool.budget))
        for hook in self.on_change:
            hook(key, True)

    async def _download(self, key: Key, ref: SourceRef,
                        need: int) -> tuple[float, int, str | None]:
        """Pull ``key`` into its directory in a thread; (seconds, bytes, digest). A
        version whose digest is not the one pinned is removed before anything sees it."""
        name, version = key
        pull = self.pulls[key]
        dest = self.root / name / str(version)
        dest.parent.mkdir(parents=True, exist_ok=True)

        def progress(done: int, total: int | None = None) -> None:
            pull.done_bytes = int(done)
            if total:
                pull.total_bytes = int(total)

        def run() -> tuple[Any, int]:
            result = ref.source.pull(version, dest, progress=progress, stop=self._stop,
                                     bandwidth_bps=self.bandwidth)
            found, want = getattr(result, "digest", None), ref.digest
            if want is not None and found != want:
                trash = self.root / f"{TRASH}{os.getpid()}-{next(self._trash_seq)}"
                os.replace(dest, trash)  # never held: nothing loads it
                shutil.rmtree(trash, ignore_errors=True)
                raise DigestMismatch(f"{ref.display_url} version {version} has digest "
                                     f"{found}, but the model pins {want}; refused, "
                                     "nothing kept")
            return result, _tree_bytes(dest)  # with what a resumed pull had before

        started = self.clock()
        try:
            result, size = await asyncio.get_running_loop().run_in_executor(
                self.executor, run)
        except Exception as exc:  # noqa: BLE001
            raise self._failure(f"model {name}:{version}", ref, exc) from None
        return (float(getattr(result, "seconds", 0.0) or (self.clock() - started)), size,
                getattr(result, "digest", None))

    def _failure(self, where: str, ref: SourceRef, exc: BaseException) -> PullError:
        """``exc`` as a ``PullError`` naming the model and the source's display URL."""
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            return DiskFull(f"{where}: the disk filled up while pulling from "
                            f"{ref.display_url}: {exc.strerror}")
        if isinstance(exc, AgentError):
            text = f"{where}: pulling from {ref.display_url} failed: {exc}"
            if exc.status == 507:
                return DiskFull(text)
            return PullError(text, exc.status, exc.retry_after)
        log.error("disk tier: %s: pulling from %s failed", where, ref.display_url,
                  exc_info=exc)
        return PullError(f"{where}: pulling from {ref.display_url} failed: "
                         f"{type(exc).__name__}", 503, 5.0)

    def _fs_free(self, key: Key) -> int:
        """The file system's free bytes less what the other pulls under way have still
        to write."""
        return self.free_bytes(self.root) - sum(
            max(p.total_bytes - p.done_bytes, 0) for k, p in self.pulls.items() if k != key)

    @contextlib.contextmanager
    def _in_flight(self) -> Iterator[None]:
        """A window on the memory tier's meter while a pull runs: its buffers count in
        the process's RSS, so a load measured meanwhile is not clean."""
        window = self.meter.begin() if self.meter is not None else None
        try:
            yield
        finally:
            if window is not None:
                self.meter.end(window)

    async def _make_room(self, key: Key, need: int) -> None:
        """Reserve ``need`` bytes in the budget, evicting (idle versions first, then the
        files of versions resident in memory), waiting in the room queue while pulls and
        loads hold the room, and check the file system has them. ``DiskFull`` (nothing
        evicted) when they can never fit; ``DiskBusy`` after the wait bound."""
        never = self._never_fits(key, need)
        if never is not None:
            raise never
        bound = self.wait_bound(key)
        give_up = self.clock() + bound
        request = RoomRequest(give_up, next(self._room_seq), key, need,
                              asyncio.get_running_loop().create_future())
        heapq.heappush(self.waiting, request)
        self.wake()
        if not request.future.done():
            log.info("disk tier: pull of %s:%s waits for room: needs %s, %s free, %s "
                     "reserved by pulls, %d pull(s) waiting", *key, format_size(need),
                     format_size(max(self.pool.free, 0)), format_size(self.pool.reserved),
                     len(self.waiting))
            try:
                await asyncio.wait({request.future}, timeout=max(give_up - self.clock(), 0))
            except BaseException:
                self._withdraw(request)
                raise
            if not request.future.done():
                self._withdraw(request)
                busy = [f"{n}:{v}" for (n, v) in self.held
                        if self.usage((n, v)) in ("pinned", "reading")]
                raise DiskBusy(
                    f"model {key[0]}:{key[1]} waited {bound:.1f}s (load_wait_max_s) for "
                    f"{format_size(need)} ({need} bytes) of the disk budget "
                    f"({format_size(self.pool.budget)}); held by pulls under way "
                    f"({format_size(self.pool.reserved)}) and by versions pinned or "
                    f"loading: {', '.join(busy) or 'none'}")
        removals = request.future.result()  # DiskFull where ``wake`` found it never fits
        try:
            await asyncio.gather(*(asyncio.wrap_future(r) for r in removals))
            fs_free = self._fs_free(key)
            if need > fs_free:
                raise DiskFull(f"model {key[0]}:{key[1]} needs {format_size(need)} ({need} "
                               f"bytes) on disk but the disk tier's file system has "
                               f"{format_size(fs_free)} ({fs_free} bytes) free")
        except BaseException:
            self.pool.cancel(need)
            self.wake()
            raise

    def _never_fits(self, key: Key, need: int) -> DiskFull | None:
        """Why ``need`` bytes can never be had (None: they can): more than the budget
        less the pinned versions, or than the file system's free bytes and every
        unpinned version together."""
        where = f"model {key[0]}:{key[1]}"
        pinned = {k: size for k, size in self.held.items() if self.usage(k) == "pinned"}
        room = self.pool.budget - sum(pinned.values())
        if need > room:
            return DiskFull(f"{where} needs {format_size(need)} ({need} bytes) but the "
                           f"disk budget is {format_size(self.pool.budget)} "
                           f"({self.pool.budget} bytes), of which {format_size(max(room, 0))} "
                           f"({max(room, 0)} bytes) can ever be freed; pinned: "
                           f"{', '.join(f'{n}:{v}' for n, v in pinned) or 'none'}")
        fs_free = self.free_bytes(self.root)
        freeable = sum(size for k, size in self.held.items() if k not in pinned)
        if need > fs_free + freeable:
            return DiskFull(f"{where} needs {format_size(need)} ({need} bytes) on disk but "
                            f"the disk tier's file system has {format_size(fs_free)} "
                            f"({fs_free} bytes) free and {format_size(freeable)} of "
                            "evictable models")
        return None

    def _reserve(self, need: int) -> list[Key] | None:
        """``pool.reserve`` of ``need`` bytes with victims among the idle versions,
        else among the idle and resident ones; None when neither makes room."""
        now = self.clock()
        idle = {k for k in self.held if self.usage(k) == "idle"}
        victims = self.pool.reserve(need, now, lambda k: k in idle)
        if victims is None:
            victims = self.pool.reserve(
                need, now, lambda k: self.usage(k) in ("idle", "resident"))
        return victims

    def wake(self) -> None:
        """Give room to the pulls waiting for it, in queue order, as far as room allows
        now; the victims' files go at once (nothing loads them from here on). Called when
        a pull or a load ends, a pin is lifted or files are dropped."""
        while self.waiting:
            head = self.waiting[0]
            victims = self._reserve(head.need)
            if victims is None:
                if self.pool.reserved or any(self.usage(k) == "reading" for k in self.held):
                    return  # a pull or a load under way frees room when it ends
                heapq.heappop(self.waiting)  # only pinned versions hold it: never
                head.future.set_exception(self._never_fits(head.key, head.need) or DiskFull(
                    f"model {head.key[0]}:{head.key[1]} needs {format_size(head.need)} "
                    f"({head.need} bytes) but the disk budget is held by pinned versions"))
                continue
            heapq.heappop(self.waiting)
            removals = []
            for victim in victims:
                log.info("disk tier: evict %s:%s (%s, download %.3fs) for %s:%s", *victim,
                         format_size(self.held[victim]), self.download_seconds(victim),
                         *head.key)
                removals.append(self._delete(victim))
                self.evicted += 1
            head.future.set_result([r for r in removals if r is not None])

    def _withdraw(self, request: RoomRequest) -> None:
        """Take a waiting pull out of the room queue (it gave up or was cancelled)."""
        if request.future.done() and not request.future.cancelled():
            if request.future.exception() is None:
                self.pool.cancel(request.need)  # granted meanwhile: give the room back
        else:
            request.future.cancel()
            self.waiting.remove(request)
            heapq.heapify(self.waiting)
        self.wake()

    def _delete(self, key: Key) -> concurrent.futures.Future | None:
        """Take ``key``'s files off disk (already out of the budget's books): renamed
        away at once (nothing loads them from here on), removed in a thread (the
        future, None when there was nothing to remove)."""
        self.held.pop(key, None)
        path = self.root / key[0] / str(key[1])
        trash = self.root / f"{TRASH}{os.getpid()}-{next(self._trash_seq)}"
        removal = None
        try:
            os.replace(path, trash)
        except OSError as exc:
            log.warning("disk tier: cannot remove %s: %s", path, exc)
        else:
            removal = self.executor.submit(shutil.rmtree, trash, ignore_errors=True)
        for hook in self.on_change:
            hook(key, False)
        return removal

    def drop(self, name: str, version: int | None = None) -> list[int]:
        """Evict ``name``'s files (one ``version`` or all) from disk where nothing
        pins, loads or serves them; returns the versions dropped."""
        keys = sorted(k for k in self.held if k[0] == name and version in (None, k[1]))
        dropped = []
        for key in keys:
            if self.usage(key) != "idle" or key in self.pulls:
                continue
            self.pool.remove(key)
            self._delete(key)
            self.evicted += 1
            dropped.append(key[1])
        if dropped:
            log.info("disk tier: dropped %s version(s) %s", name,
                     ", ".join(map(str, dropped)))
            self.wake()
        return dropped

    async def close(self) -> None:
        """Stop the pulls under way (their partials stay for a resume)."""
        self._stop.set()
        tasks = [p.task for p in self.pulls.values()]
        if tasks:
            await asyncio.wait(tasks, timeout=30)
        self.executor.shutdown(wait=False, cancel_futures=True)
