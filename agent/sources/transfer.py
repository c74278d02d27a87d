"""The one pull every scheme shares: a version's files streamed into a sibling
``.partial-<name>`` directory (resumed where an earlier pull of the same listing
stopped), each checked against its size and digest, then renamed into place in one
step. A scheme says only how to list and how to open a file at an offset
(``BaseSource``). A transfer slower than ``MIN_RATE_BPS`` over ``timeout_s`` is cut
(kept for a resume): a server that drips holds nothing for long."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO, ContextManager

from agent.sources.archive import MAX_BYTES, MAX_ENTRIES, Allowance, unpack
from agent.sources.bandwidth import TokenBucket
from agent.sources.errors import (DigestMismatch, DiskFull, PullStopped, SourceError,
                                  SourceNotFound, SourceUnavailable)

#: Bytes read and written at a time: memory stays bounded whatever the file's size.
CHUNK = 1 << 20
PARTIAL_PREFIX = ".partial-"
#: A transfer that brings fewer bytes a second than this over a window of its
#: source's ``timeout_s`` is cut as stalled (a slower bandwidth cap lowers it).
MIN_RATE_BPS = 1024
_STATE = "state.json"
_FILES = "files"
_ARCHIVE = "archive"


@dataclass(frozen=True)
class RemoteFile:
    """One file of a version: ``path`` relative to the version directory, ``size`` in
    bytes (-1 where the source does not say), ``digest`` ``"sha256:<hex>"`` or
    ``"md5:<hex>"`` where the source gives one."""

    path: str
    size: int
    digest: str | None = None


@dataclass(frozen=True)
class PullResult:
    """A finished pull: the version, the bytes it transferred (not those resumed from
    an earlier try), its seconds, and the digest of the whole version (a manifest's
    digest, or the sha256 of its ``SHA256SUMS`` text)."""

    version: int
    bytes: int
    seconds: float
    digest: str


@dataclass
class Stream:
    """An opened file: ``start`` is the offset the source honoured (the one asked for,
    or 0 where it cannot resume) and ``chunks`` its bytes from there."""

    start: int
    chunks: Iterable[bytes]


def partial_dir(dest: Path) -> Path:
    """Where a pull into ``dest`` keeps its partial data."""
    return dest.with_name(PARTIAL_PREFIX + dest.name)


def free_bytes(path: Path) -> int:
    """Free bytes on ``path``'s file system (for unprivileged writers)."""
    return shutil.disk_usage(path).free


def safe_relpath(path: str, where: str) -> str:
    """``path`` when it is a plain relative path (no root, no ``..``, no empty or
    backslashed part), else a SourceError naming ``where`` it came from."""
    parts = PurePosixPath(path).parts
    if (not path or path.startswith("/") or "\\" in path or "\x00" in path
            or any(p in ("..", ".", "") for p in parts) or ":" in parts[0]):
        raise SourceError(f"{where}: unsafe file path {path!r} (absolute, '..' or empty "
                          "parts are refused)")
    return str(PurePosixPath(*parts))


class _Hashes:
    """sha256 (always: the version's digest) and md5 (where the digest is one)."""

    def __init__(self, digest: str | None) -> None:
        self.sha256 = hashlib.sha256()
        self.md5 = hashlib.md5(usedforsecurity=False) if digest and digest.startswith(
            "md5:") else None

    def update(self, data: bytes) -> None:
        self.sha256.update(data)
        if self.md5 is not None:
            self.md5.update(data)

    def matches(self, digest: str | None) -> bool:
        if digest is None:
            return True
        algo, _, want = digest.partition(":")
        got = self.md5 if algo == "md5" else self.sha256
        return got.hexdigest() == want.lower()


def sums_line(sha256_hex: str, path: str) -> str:
    """One file's line of a version's ``SHA256SUMS`` text (``sha256sum``'s format)."""
    return f"{sha256_hex}  {path}\n"


def tree_digest(directory: Path) -> str:
    """The digest a pull of the version directory ``directory``'s files reports from a
    ``file://`` or ``s3://`` source: the sha256 of their ``SHA256SUMS`` text."""
    lines = []
    for path in sorted((p for p in Path(directory).rglob("*") if p.is_file()),
                       key=lambda p: p.relative_to(directory).as_posix()):
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(CHUNK), b""):
                h.update(chunk)
        lines.append(sums_line(h.hexdigest(), path.relative_to(directory).as_posix()))
    return "sha256:" + hashlib.sha256("".join(lines).encode()).hexdigest()


def check_digest(digest: str, where: str) -> str:
    """``digest`` when it reads ``sha256:<64 hex>``, else a SourceError naming it."""
    algo, _, hexpart = digest.partition(":")
    if algo != "sha256" or len(hexpart) != 64 or any(
            c not in "0123456789abcdef" for c in hexpart.lower()):
        raise SourceError(f"{where}: bad digest {digest[:80]!r}: expected sha256:<64 hex digits>")
    return f"sha256:{hexpart.lower()}"


class BaseSource:
    """A source's pull, given how to list (``versions``, ``files``) and read
    (``open``) its files. ``archive`` ("tar"/"zip") makes the one listed file an
    archive unpacked as the version. ``clock`` times the pull and the bandwidth cap,
    ``sleep`` waits for the cap (by default the stop event's wait), ``disk_free``
    says the room left (a test may inject less than there is). ``timeout_s`` is the
    window of the stall check (a scheme's own connect/read timeout)."""

    display_url: str = ""
    archive: str | None = None
    timeout_s: float = 30.0

    def __init__(self, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], object] | None = None,
                 disk_free: Callable[[Path], int] = free_bytes,
                 max_unpacked_bytes: int = MAX_BYTES,
                 max_unpacked_entries: int = MAX_ENTRIES) -> None:
        self._clock = clock
        self._sleep = sleep
        self._disk_free = disk_free
        self.max_unpacked_bytes = max_unpacked_bytes
        self.max_unpacked_entries = max_unpacked_entries

    # -- what a scheme provides -------------------------------------------------------

    def versions(self) -> list[int]:
        raise NotImplementedError

    def files(self, version: int) -> list[RemoteFile]:
        raise NotImplementedError

    def open(self, version: int, file: RemoteFile, offset: int) -> ContextManager[Stream]:
        raise NotImplementedError

    def verify(self, version: int, file: RemoteFile, path: Path) -> None:
        """A scheme's extra check of a downloaded file (beyond size and digest)."""

    def version_digest(self, version: int, sums: str) -> str:
        """The digest a pull reports: by default the sha256 of the version's
        ``SHA256SUMS`` text (``sums``: ``sums_line`` of each file, sorted by path)."""
        return "sha256:" + hashlib.sha256(sums.encode()).hexdigest()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.display_url}>"

    # -- the pull ---------------------------------------------------------------------

    def pull(self, version: int, dest: Path, *, progress: Callable[[int], None] | None = None,
             stop: threading.Event | None = None, bandwidth_bps: int | None = None,
             allowance: Allowance | None = None) -> PullResult:
        """Download ``version`` into ``dest`` (which must not exist), verified, resumed
        from an earlier partial pull of the same listing; see the module's docstring.
        ``allowance``: the room an archive may unpack to (``NeedsRoom`` past it, the
        archive kept for the next pull); without one, the file system's free room."""
        dest = Path(dest)
        if dest.exists():
            raise SourceError(f"pull of {self.display_url} version {version}: "
                              f"{dest} exists already")
        started = self._clock()
        listing = self.files(version)
        _check_listing(listing, self.display_url)
        if self.archive and len(listing) != 1:
            raise SourceError(f"{self.display_url}: an archive source lists one file")
        partial = partial_dir(dest)
        try:
            result = self._pull_into(version, listing, partial, dest, started, progress, stop,
                                     bandwidth_bps, allowance)
        except (DigestMismatch, DiskFull, SourceNotFound):
            shutil.rmtree(partial, ignore_errors=True)
            raise
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                shutil.rmtree(partial, ignore_errors=True)
                raise DiskFull(f"disk full pulling {self.display_url} version {version}: "
                               f"needed {_total(listing)} bytes, "
                               f"{_free_or_zero(self._disk_free, dest.parent)} free") from None
            raise
        return result

    def _pull_into(self, version: int, listing: list[RemoteFile], partial: Path, dest: Path,
                   started: float, progress: Callable[[int], None] | None,
                   stop: threading.Event | None, bandwidth_bps: int | None,
                   allowance: Allowance | None) -> PullResult:
        state = json.dumps({"source": self.display_url, "version": version, "archive": self.archive,
                            "files": [[f.path, f.size, f.digest] for f in listing]})
        state_file = partial / _STATE
        if not (state_file.is_file() and state_file.read_text() == state):
            shutil.rmtree(partial, ignore_errors=True)  # another listing's data: start over
        partial.mkdir(parents=True, exist_ok=True)
        state_file.write_text(state)
        root = partial / (_ARCHIVE if self.archive else _FILES)
        had = {f.path: _size_or_zero(root / f.path) for f in listing}
        needed = sum(max(0, f.size - had[f.path]) for f in listing)
        free = self._disk_free(partial)
        if needed > free:
            raise DiskFull(f"disk full pulling {self.display_url} version {version}: "
                           f"needed {needed} bytes, {free} free")
        sleep = self._sleep or (stop.wait if stop is not None else time.sleep)
        bucket = (TokenBucket(bandwidth_bps, clock=self._clock, sleep=sleep)
                  if bandwidth_bps else None)
        counter = _Counter(sum(min(had[f.path], max(f.size, 0)) for f in listing), progress)
        counter.report()
        min_rate = MIN_RATE_BPS if not bandwidth_bps else min(MIN_RATE_BPS, bandwidth_bps // 2)
        sums = []
        for f in sorted(listing, key=lambda f: f.path):
            sha = self._pull_file(version, f, root / f.path, counter, stop, bucket,
                                  _Stall(self._clock, self.timeout_s, max(min_rate, 1)))
            sums.append(sums_line(sha, f.path))
        if self.archive:
            content = partial / _FILES
            shutil.rmtree(content, ignore_errors=True)
            unpack(root / listing[0].path, self.archive, content, where=self.display_url,
                   max_bytes=self.max_unpacked_bytes, max_entries=self.max_unpacked_entries,
                   allowance=allowance, free=lambda: self._disk_free(partial), stop=stop)
        (partial / _FILES).mkdir(exist_ok=True)
        try:
            os.rename(partial / _FILES, dest)
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            raise SourceError(f"pull of {self.display_url} version {version}: {dest} "
                              "appeared meanwhile (one pull per destination at a time)") from None
        shutil.rmtree(partial, ignore_errors=True)
        return PullResult(version, counter.transferred, self._clock() - started,
                          self.version_digest(version, "".join(sums)))

    def _pull_file(self, version: int, f: RemoteFile, target: Path, counter: _Counter,
                   stop: threading.Event | None, bucket: TokenBucket | None,
                   stall: _Stall) -> str:
        """Download (or finish) one file into ``target``; its sha256 hex when verified."""
        target.parent.mkdir(parents=True, exist_ok=True)
        offset = _size_or_zero(target)
        if f.size >= 0 and offset > f.size:
            counter.add(-offset)
            offset = 0
        if stop is not None and stop.is_set():
            raise PullStopped(f"pull of {self.display_url} stopped")
        hashes = _Hashes(f.digest)
        if f.size < 0 or offset < f.size:
            with self.open(version, f, offset) as stream, \
                    open(target, "r+b" if offset else "wb") as out:
                if stream.start != offset:  # the source cannot resume: from the start
                    counter.add(-offset)
                    offset = 0
                _hash_prefix(out, offset, hashes)
                out.seek(offset)
                out.truncate()
                for chunk in self._read(stream.chunks, f):
                    if stop is not None and stop.is_set():
                        raise PullStopped(f"pull of {self.display_url} stopped")
                    if bucket is not None:
                        bucket.take(len(chunk))
                    out.write(chunk)
                    hashes.update(chunk)
                    offset += len(chunk)
                    counter.add(len(chunk), transferred=True)
                    if stall.slow(len(chunk)):
                        raise SourceUnavailable(
                            f"{self.display_url}: {f.path}: transfer stalled (under "
                            f"{stall.min_rate} bytes/s for {stall.window:g} s); kept for a "
                            "resume")
                    if f.size >= 0 and offset > f.size:
                        raise DigestMismatch(f"{self.display_url}: {f.path}: more bytes than "
                                             f"the listed {f.size}")
            if f.size >= 0 and offset < f.size:
                raise SourceUnavailable(f"{self.display_url}: {f.path}: transfer cut after "
                                        f"{offset} of {f.size} bytes (kept for a resume)")
        else:
            with open(target, "rb") as done:
                _hash_prefix(done, offset, hashes)
        if not hashes.matches(f.digest):
            raise DigestMismatch(f"{self.display_url}: {f.path}: its bytes do not match "
                                 f"{f.digest} (got sha256:{hashes.sha256.hexdigest()}); "
                                 "nothing was kept")
        self.verify(version, f, target)
        return hashes.sha256.hexdigest()

    def _read(self, chunks: Iterable[bytes], f: RemoteFile) -> Iterator[bytes]:
        """``chunks`` with a cut connection or a timeout said as SourceUnavailable."""
        import http.client

        it = iter(chunks)
        while True:
            try:
                chunk = next(it)
            except StopIteration:
                return
            except (OSError, http.client.HTTPException) as exc:
                raise SourceUnavailable(f"{self.display_url}: {f.path}: transfer cut "
                                        f"({type(exc).__name__}); kept for a resume") from None
            if chunk:
                yield chunk


class _Stall:
    """Whether a transfer brought fewer than ``min_rate`` bytes a second over a
    window of ``window`` seconds (windows end at chunks: a silent server is the
    socket timeout's)."""

    def __init__(self, clock: Callable[[], float], window: float, min_rate: int) -> None:
        self.clock, self.window, self.min_rate = clock, window, min_rate
        self._start, self._bytes = clock(), 0

    def slow(self, n: int) -> bool:
        self._bytes += n
        elapsed = self.clock() - self._start
        if elapsed < self.window:
            return False
        if self._bytes < self.min_rate * elapsed:
            return True
        self._start, self._bytes = self.clock(), 0
        return False


class _Counter:
    """Bytes done (for ``progress``) and bytes transferred by this pull."""

    def __init__(self, done: int, progress: Callable[[int], None] | None) -> None:
        self.done = done
        self.transferred = 0
        self._progress = progress

    def add(self, n: int, *, transferred: bool = False) -> None:
        self.done += n
        if transferred:
            self.transferred += n
        self.report()

    def report(self) -> None:
        if self._progress is not None:
            self._progress(self.done)


def _check_listing(listing: list[RemoteFile], where: str) -> None:
    """Every path safe, none twice, none both a file and a directory."""
    paths = [safe_relpath(f.path, where) for f in listing]
    dirs = {str(parent) for p in paths for parent in PurePosixPath(p).parents}
    clash = sorted({p for p in paths if paths.count(p) > 1} | (set(paths) & dirs))
    if clash:
        raise SourceError(f"{where}: the listing names {clash[0]!r} twice (or as a file "
                          "and a directory)")


def _hash_prefix(f: BinaryIO, n: int, hashes: _Hashes) -> None:
    f.seek(0)
    left = n
    while left > 0:
        data = f.read(min(CHUNK, left))
        if not data:
            break
        hashes.update(data)
        left -= len(data)


def _size_or_zero(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _total(listing: list[RemoteFile]) -> int:
    return sum(max(f.size, 0) for f in listing)


def _free_or_zero(disk_free: Callable[[Path], int], path: Path) -> int:
    with contextlib.suppress(OSError):
        return disk_free(path)
    return 0
