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
loading) waits in the tier's room queue (``cachepolicies.roomqueue``, the memory tier's
own): granted in deadline-then-arrival order as the tier's bookkeeping changes (a pull
ends, files are dropped, what memory does with a version changes), by its model's
``load_wait_max_s`` (``DiskBusy``, 503 + Retry-After, after it). Files that can never fit
(more than the budget less the pinned versions, or than the file system could ever
free) and a full file system fail the pull with ``NoDiskRoom`` (507) naming the model, the
bytes it needs and the bytes free, and evict nothing. A pull in flight is a window on
the memory tier's meter: a load measured meanwhile (its RSS counts the pull's buffers)
is booked at its estimate. A model whose config pins a ``digest`` gets only a version of
that digest (the pull's ``PullResult.digest``, kept in ``.tier.json`` with each
version): one that differs is removed and refused (502), naming both digests.

An archive source's pull first reserves the archive's bytes; once the archive is
verified its entries say what it unpacks to, and that room is reserved (evicting or
waiting as any pull) before a byte is unpacked (``agent.sources.Allowance``), so the
files never outgrow the budget.

What it needs of the memory tier comes at construction (``MemoryView``: what memory does
with a version, how long a pull may wait, and who hears that files came or went), and so
does the memory tier's meter. The listings and what the tier remembers of its pulls are
``agent.node.cache.sourcelistings``. At start it scans its directory: complete
version directories are holdings (a pull renames a version into place only once every
file is verified), anything else is a partial pull, kept for the next pull to resume
and never loaded.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import itertools
import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

from cachepolicies.pool import MemoryPool
from cachepolicies.registry import make_policy
from cachepolicies.roomqueue import RoomQueue, RoomTimeout, Waiter

from agent.config import ModelConfig
from agent.errors import AgentError
from agent.memory import MemoryMeter
from agent.node.cache.errors import DiskBusy, NoDiskRoom, NotSourced, PullError
from agent.node.cache.sourcelistings import (SourceListings, SourceRef,
                                             default_open_source)
from agent.node.repository import Listing
from agent.sources.archive import Allowance
from agent.sources.errors import DigestMismatch, NeedsRoom
from agent.units import format_size

log = logging.getLogger("edgeagent.disk")

Key = tuple[str, int]
TRASH = ".trash-"

#: What the memory tier does with a version, as the disk tier asks (``MemoryView.usage``):
#: ``pinned`` and ``reading`` (loading, or served by a runtime that reads its files) are
#: never evicted; ``resident`` (in memory, files not needed) only after every ``idle``.
USAGES = ("pinned", "reading", "resident", "idle")


class MemoryView(Protocol):
    """What the disk tier needs of the memory tier (``agent.node.cache.tiers`` answers)."""

    def usage(self, key: Key) -> str:
        """What memory does with ``key``'s files: one of ``USAGES``."""

    def wait_bound(self, key: Key) -> float:
        """Seconds a pull of ``key`` may wait for disk room."""

    def files_changed(self, key: Key, on_disk: bool) -> None:
        """``key``'s files arrived (``on_disk``) or left."""


class NothingInMemory:
    """The memory view of a disk tier alone: every version idle, pulls wait 30 s."""

    def usage(self, key: Key) -> str:
        return "idle"

    def wait_bound(self, key: Key) -> float:
        return 30.0

    def files_changed(self, key: Key, on_disk: bool) -> None:
        pass


@dataclass
class PullUnderWay:
    """A pull under way: its task and its progress (written by the pulling thread)."""

    key: Key
    task: asyncio.Task
    started: float  # wall clock
    done_bytes: int = 0
    total_bytes: int = 0


def _free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


def _tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


class DiskTier:
    """Sourced models' files on this node's disk, under a byte budget."""

    def __init__(self, root: Path, budget: int | None = None, *,
                 policy: str = "cremebrulee-forecast",
                 open_source: Callable[[str, dict], Any] = default_open_source,
                 max_concurrent_pulls: int = 2, bandwidth: int | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time,
                 free_bytes: Callable[[Path], int] = _free_bytes,
                 memory: MemoryView = NothingInMemory(),
                 meter: MemoryMeter | None = None) -> None:
        self.root = Path(root)  # made by the first pull
        self.bandwidth, self.memory, self.meter = bandwidth, memory, meter
        self.clock, self.wall_clock, self.free_bytes = clock, wall_clock, free_bytes
        self.max_concurrent_pulls = max_concurrent_pulls
        self._slots = asyncio.Semaphore(max_concurrent_pulls)
        self.executor = concurrent.futures.ThreadPoolExecutor(max_concurrent_pulls + 2, "edgeagent-pull")
        self._stop = threading.Event()
        self._trash_seq = itertools.count()
        self.rooms = RoomQueue(self)  # pulls waiting for room; this tier is its Room
        self.listings = SourceListings(self.root, self.executor, open_source=open_source,
                                       wall_clock=wall_clock)
        self.pulls: dict[Key, PullUnderWay] = {}
        self.pulled = self.evicted = self.pull_failures = 0
        self.pulled_bytes = 0
        #: the last failure of each version's pull (cleared when one succeeds)
        self.errors: dict[Key, str] = {}
        self.held: dict[Key, int] = self._scan()
        if budget is None:
            existing = next(p for p in (self.root, *self.root.parents) if p.exists())
            budget = (free_bytes(existing) + sum(self.held.values())) // 2
        self.pool = MemoryPool(budget, make_policy(policy))
        for key, size in self.held.items():  # as found, over the budget or not: the
            # next pull evicts down to it
            self.pool.commit(key, 0, size, self.download_seconds(key), clock())

    # -- start: what is on disk ------------------------------------------------------
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

    # -- listings (``SourceListings``) ------------------------------------------------
    @property
    def sources(self) -> dict[str, SourceRef]:
        return self.listings.sources

    def listing(self, name: str, config: ModelConfig, where: Path) -> Listing:
        """A sourced model's versions as known now (no I/O): the repository scan calls
        it (``agent.node.repository.Listings``)."""
        return self.listings.listing(name, config, where)

    async def refresh(self, names: list[str] | None = None,
                      on_change: Callable[[list[str]], None] | None = None) -> list[str]:
        """List the sources (of ``names``, default all); the names whose listing changed,
        told to ``on_change`` as they finish (``SourceListings.refresh``)."""
        return await self.listings.refresh(names, on_change)

    def listing_error(self, name: str) -> str | None:
        return self.listings.listing_error(name)

    def download_seconds(self, key: Key) -> float:
        """The last measured download of ``key`` (0 before any)."""
        return self.listings.download_seconds(key)

    # -- holdings ------------------------------------------------------------------------
    def has(self, key: Key) -> bool:
        """``key``'s files are on disk (and of the digest its config pins, if any)."""
        return key in self.held and self._digest_ok(key)

    def _digest_ok(self, key: Key) -> bool:
        ref = self.sources.get(key[0])
        return ref is None or ref.digest is None or self.listings.digest(key) == ref.digest

    def pulled_profile(self, key: Key) -> tuple[float, int]:
        """``key``'s last measured pull as its twin replays it: (download seconds, bytes
        on disk); its bytes now where it is on disk, else those its last pull wrote."""
        size = self.held.get(key)
        if size is None:
            size = self.listings.pulled_bytes(key)
        return self.download_seconds(key), int(size)

    def record_access(self, key: Key) -> None:
        """A request for ``key`` (the disk policy's request rates)."""
        self.pool.policy.record_access(key, self.clock())

    def holdings(self) -> list[dict[str, Any]]:
        """What is on disk: ``[{model, version, bytes, download_seconds, digest}]``."""
        return [{"model": n, "version": v, "bytes": size,
                 "download_seconds": round(self.download_seconds((n, v)), 6),
                 "digest": self.listings.digest((n, v))}
                for (n, v), size in sorted(self.held.items())]

    def pulling(self) -> list[dict[str, Any]]:
        """Pulls under way: ``[{model, version, bytes, total_bytes, started}]``."""
        return [{"model": p.key[0], "version": p.key[1], "bytes": p.done_bytes,
                 "total_bytes": p.total_bytes, "started": p.started}
                for p in sorted(self.pulls.values(), key=lambda p: p.key)]

    def pull_errors(self) -> list[dict[str, Any]]:
        """Each version's last failed pull: ``[{model, version, error}]``."""
        return [{"model": n, "version": v, "error": e}
                for (n, v), e in sorted(self.errors.items())]

    def progress(self, key: Key) -> dict[str, int] | None:
        pull = self.pulls.get(key)
        return None if pull is None else {"bytes": pull.done_bytes,
                                          "total_bytes": pull.total_bytes}

    def summary(self) -> dict[str, Any]:
        """The tier's figures (``/v1/disk``, ``/metrics``)."""
        return {"budget_bytes": self.pool.budget, "used_bytes": self.pool.used,
                "reserved_bytes": self.pool.reserved, "versions": len(self.held),
                "pulling": len(self.pulls), "waiting_pulls": len(self.rooms),
                "pulls": self.pulled,
                "pulled_bytes": self.pulled_bytes, "pull_failures": self.pull_failures,
                "evictions": self.evicted}

    # -- pulling ---------------------------------------------------------------------------
    async def ensure(self, name: str, version: int, *, loading: bool = False) -> None:
        """Pull ``name``'s ``version`` if it is not on disk (or is, of a digest other
        than its pinned one); every caller of a version being pulled awaits that one
        pull. ``PullError`` (``NoDiskRoom``) when it fails. ``loading``: the caller is the
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
            pull = self.pulls[key] = PullUnderWay(key, task, self.wall_clock())
            task.add_done_callback(lambda t: self._pull_done(key, t))
        await asyncio.shield(pull.task)

    def _drop_other_digest(self, key: Key, loading: bool) -> None:
        """Take off disk ``key``'s files of a digest other than the pinned one, so that
        the pinned one is pulled; a 409 ``PullError`` while memory still uses them."""
        name, version = key
        found, want = self.listings.digest(key), self.sources[name].digest
        if self.memory.usage(key) != "idle" and not loading:
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
        self.changed()

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
            reserved = need
            allowance = Allowance(0, self._most() - need)
            try:
                with self._in_flight():
                    while True:
                        try:
                            seconds, size, digest = await self._download(key, ref, allowance)
                            break
                        except NeedsRoom as more:  # an archive, verified: its room next
                            if allowance.room:
                                raise self._failure(where, ref, more) from None
                            self.pool.cancel(reserved)
                            reserved = 0
                            await self._make_room(key, need + more.needed)
                            reserved = need + more.needed
                            allowance = Allowance(more.needed, allowance.most)
            except BaseException:
                self.pool.cancel(reserved)
                raise
        self.pool.commit(key, reserved, size, seconds, self.clock())
        self.held[key] = size
        self.pulled += 1
        self.pulled_bytes += size
        self.listings.record_pull(key, seconds, size, digest)
        await self.listings.persist()
        log.info("disk tier: pulled %s from %s: %s in %.3fs; disk %s/%s", where,
                 ref.display_url, format_size(size), seconds, format_size(self.pool.used),
                 format_size(self.pool.budget))
        self.memory.files_changed(key, True)

    async def _download(self, key: Key, ref: SourceRef,
                        allowance: Allowance) -> tuple[float, int, str | None]:
        """Pull ``key`` into its directory in a thread; (seconds, bytes, digest). A
        version whose digest is not the one pinned is removed before anything sees it.
        ``NeedsRoom`` as it is: an archive that needs more than ``allowance``."""
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
                                     bandwidth_bps=self.bandwidth, allowance=allowance)
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
        except NeedsRoom:
            raise
        except Exception as exc:  # noqa: BLE001
            raise self._failure(f"model {name}:{version}", ref, exc) from None
        return (float(getattr(result, "seconds", 0.0) or (self.clock() - started)), size,
                getattr(result, "digest", None))

    def _failure(self, where: str, ref: SourceRef, exc: BaseException) -> PullError:
        """``exc`` as a ``PullError`` naming the model and the source's display URL."""
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            return NoDiskRoom(f"{where}: the disk filled up while pulling from "
                            f"{ref.display_url}: {exc.strerror}")
        if isinstance(exc, AgentError):
            text = f"{where}: pulling from {ref.display_url} failed: {exc}"
            if exc.status == 507:
                return NoDiskRoom(text)
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
        loads hold the room, and check the file system has them. ``NoDiskRoom`` (nothing
        evicted) when they can never fit; ``DiskBusy`` after the wait bound."""
        never = self._never_fits(key, need)
        if never is not None:
            raise never
        bound = self.memory.wait_bound(key)
        try:
            waiter = await self.rooms.wait(key, need, self.clock() + bound, self.clock,
                                           on_queued=self._queued)
        except RoomTimeout:
            raise self._busy(key, need, bound) from None
        try:
            await asyncio.gather(*(asyncio.wrap_future(r) for r in waiter.granted))
            fs_free = self._fs_free(key)
            if need > fs_free:
                raise NoDiskRoom(f"model {key[0]}:{key[1]} needs {format_size(need)} ({need} "
                               f"bytes) on disk but the disk tier's file system has "
                               f"{format_size(fs_free)} ({fs_free} bytes) free")
        except BaseException:
            self.pool.cancel(need)
            self.changed()
            raise

    def _most(self) -> int:
        """The most bytes ``key`` can ever be given: the budget less the pinned versions."""
        return self.pool.budget - sum(size for k, size in self.held.items()
                                      if self.memory.usage(k) == "pinned")

    def _queued(self, waiter: Waiter) -> None:
        log.info("disk tier: pull of %s:%s waits for room: needs %s, %s free, %s "
                 "reserved by pulls, %d pull(s) waiting", *waiter.key,
                 format_size(waiter.need), format_size(max(self.pool.free, 0)),
                 format_size(self.pool.reserved), len(self.rooms))

    def _busy(self, key: Key, need: int, bound: float) -> DiskBusy:
        busy = [f"{n}:{v}" for (n, v) in self.held
                if self.memory.usage((n, v)) in ("pinned", "reading")]
        return DiskBusy(
            f"model {key[0]}:{key[1]} waited {bound:.1f}s (load_wait_max_s) for "
            f"{format_size(need)} ({need} bytes) of the disk budget "
            f"({format_size(self.pool.budget)}); held by pulls under way "
            f"({format_size(self.pool.reserved)}) and by versions pinned or "
            f"loading: {', '.join(busy) or 'none'}")

    def _never_fits(self, key: Key, need: int) -> NoDiskRoom | None:
        """Why ``need`` bytes can never be had (None: they can): more than the budget
        less the pinned versions, or than the file system's free bytes and every
        unpinned version together."""
        where = f"model {key[0]}:{key[1]}"
        pinned = {k: size for k, size in self.held.items()
                  if self.memory.usage(k) == "pinned"}
        room = self._most()
        if need > room:
            return NoDiskRoom(f"{where} needs {format_size(need)} ({need} bytes) but the "
                           f"disk budget is {format_size(self.pool.budget)} "
                           f"({self.pool.budget} bytes), of which {format_size(max(room, 0))} "
                           f"({max(room, 0)} bytes) can ever be freed; pinned: "
                           f"{', '.join(f'{n}:{v}' for n, v in pinned) or 'none'}")
        fs_free = self.free_bytes(self.root)
        freeable = sum(size for k, size in self.held.items() if k not in pinned)
        if need > fs_free + freeable:
            return NoDiskRoom(f"{where} needs {format_size(need)} ({need} bytes) on disk but "
                            f"the disk tier's file system has {format_size(fs_free)} "
                            f"({fs_free} bytes) free and {format_size(freeable)} of "
                            "evictable models")
        return None

    # -- the books and the room queue's Room -------------------------------------------
    def changed(self) -> None:
        """What is free or evictable may have changed: grant the waiting pulls."""
        self.rooms.changed(self.clock())

    def usage_changed(self) -> None:
        """What memory does with a version changed (a load began or ended, an unload
        ended, a pin changed): files it read may be evictable now."""
        self.changed()

    def take(self, waiter: Waiter, now: float) -> list | None:
        """Reserve room for a waiting pull, victims among the idle versions, else among
        the idle and the resident ones; their files go at once (nothing loads them from
        here on): the grant is their removals."""
        idle = {k for k in self.held if self.memory.usage(k) == "idle"}
        victims = self.pool.reserve(waiter.need, now, lambda k: k in idle)
        if victims is None:
            victims = self.pool.reserve(
                waiter.need, now, lambda k: self.memory.usage(k) in ("idle", "resident"))
        if victims is None:
            return None
        removals = []
        for victim in victims:
            log.info("disk tier: evict %s:%s (%s, download %.3fs) for %s:%s", *victim,
                     format_size(self.held[victim]), self.download_seconds(victim),
                     *waiter.key)
            removals.append(self._delete(victim))
            self.evicted += 1
        return [r for r in removals if r is not None]

    def futile(self, waiter: Waiter) -> NoDiskRoom | None:
        """Refuse a pull only pinned versions stand in the way of."""
        if self.pool.reserved or any(self.memory.usage(k) == "reading" for k in self.held):
            return None  # a pull or a load under way frees room when it ends
        return self._never_fits(waiter.key, waiter.need) or NoDiskRoom(
            f"model {waiter.key[0]}:{waiter.key[1]} needs {format_size(waiter.need)} "
            f"({waiter.need} bytes) but the disk budget is held by pinned versions")

    def give_back(self, waiter: Waiter) -> None:
        self.pool.cancel(waiter.need)

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
        self.memory.files_changed(key, False)
        return removal

    def drop(self, name: str, version: int | None = None) -> list[int]:
        """Evict ``name``'s files (one ``version`` or all) from disk where nothing
        pins, loads or serves them; returns the versions dropped."""
        keys = sorted(k for k in self.held if k[0] == name and version in (None, k[1]))
        dropped = []
        for key in keys:
            if self.memory.usage(key) != "idle" or key in self.pulls:
                continue
            self.pool.remove(key)
            self._delete(key)
            self.evicted += 1
            dropped.append(key[1])
        if dropped:
            log.info("disk tier: dropped %s version(s) %s", name,
                     ", ".join(map(str, dropped)))
            self.changed()
        return dropped

    async def close(self) -> None:
        """Stop the pulls under way (their partials stay for a resume)."""
        self._stop.set()
        tasks = [p.task for p in self.pulls.values()]
        if tasks:
            await asyncio.wait(tasks, timeout=30)
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.listings.close()
