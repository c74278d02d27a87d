"""A downloaded archive (.tar, .tar.gz/.tgz, .zip) unpacked as a version directory,
safely: regular files and directories only (no links, devices or absolute or ``..``
paths), no entry twice or both a file and a directory, at most ``max_entries``
entries and ``max_bytes`` bytes, within the room its caller gives it (``Allowance``)
and the disk's free room, streamed in chunks. Entries are read lazily and the
reading stops at the first cap passed: a bomb costs its cap, not its size."""

from __future__ import annotations

import contextlib
import stat
import tarfile
import threading
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from agent.sources.errors import DigestMismatch, DiskFull, NeedsRoom, PullStopped

_CHUNK = 1 << 20
#: The most entries an archive may hold by default (``source_options.max_unpacked_entries``).
MAX_ENTRIES = 10_000
#: The most bytes an archive may unpack to by default (``source_options.max_unpacked_bytes``).
MAX_BYTES = 64 << 30

# (name, why it is refused or None, size, opener or None for a directory)
_Entry = tuple[str, str | None, int, Callable[[], IO[bytes]] | None]


@dataclass(frozen=True)
class Allowance:
    """What an unpacked archive may take on its caller's disk budget: ``room`` bytes
    held for it now (more: ``NeedsRoom``, asking for what it needs) and ``most`` bytes
    it can ever be given (more: ``DiskFull``)."""

    room: int
    most: int


def archive_kind(name: str) -> str | None:
    """"tar" or "zip" for an archive's file name, else None (a plain file)."""
    lower = name.lower()
    if lower.endswith((".tar.gz", ".tgz", ".tar", ".tar.xz", ".tar.bz2")):
        return "tar"
    if lower.endswith(".zip"):
        return "zip"
    return None


def unpack(archive: Path, kind: str, dest: Path, *, where: str, max_bytes: int = MAX_BYTES,
           max_entries: int = MAX_ENTRIES, allowance: Allowance | None = None,
           free: Callable[[], int], stop: threading.Event | None = None) -> None:
    """Unpack ``archive`` into ``dest`` (created). Every entry is checked before a
    byte is written: a hostile or conflicting entry, more than ``max_entries`` entries
    or ``max_bytes`` bytes is a DigestMismatch naming it (not a model we accept); more
    than ``allowance`` or than ``free()`` is refused as its class says."""
    most = max_bytes if allowance is None else min(max_bytes, allowance.most)
    try:
        with _open(archive, kind) as members:
            entries, total = _checked(members, where, max_bytes, max_entries, most)
            if allowance is not None and total > allowance.room:
                raise NeedsRoom(f"{where}: the archive unpacks to {total} bytes; "
                                f"{allowance.room} are held for it", total)
            room = free()
            if total > room:
                raise DiskFull(f"disk full unpacking {where}: needed {total} bytes, "
                               f"{room} free")
            dest.mkdir(parents=True)
            for name, size, opener in entries:
                target = dest.joinpath(*PurePosixPath(name).parts)
                if opener is None:
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                _copy(opener(), target, size, where, name, stop)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error) as exc:
        raise DigestMismatch(f"{where}: not a readable {kind} archive "
                             f"({type(exc).__name__})") from None


def _checked(members: Iterator[_Entry], where: str, max_bytes: int, max_entries: int,
             most: int) -> tuple[list[tuple[str, int, Callable[[], IO[bytes]] | None]], int]:
    """The entries as (safe name, size, opener) and their total, read until a cap is
    passed (then refused, naming the cap)."""
    entries: list[tuple[str, int, Callable[[], IO[bytes]] | None]] = []
    kinds: dict[str, str] = {}  # safe name -> "file" or "directory"
    total = 0
    for raw_name, why, size, opener in members:
        if len(entries) == max_entries:
            raise DigestMismatch(f"{where}: the archive has more than {max_entries} entries "
                                 "(source_options.max_unpacked_entries): refused")
        name = _check(where, raw_name, why)
        kind = "directory" if opener is None else "file"
        seen = kinds.get(name)
        if seen is not None and not seen == kind == "directory":
            raise DigestMismatch(
                f"{where}: archive entry {raw_name[:200]!r} names {name!r} twice"
                + ("" if seen == kind else f" (a {seen}, then a {kind})"))
        for parent in PurePosixPath(name).parents:
            if kinds.setdefault(str(parent), "directory") != "directory":
                raise DigestMismatch(f"{where}: archive entry {raw_name[:200]!r} puts a "
                                     f"path under {str(parent)!r}, which is a file")
        kinds[name] = kind
        total += size
        if total > most:
            if total > max_bytes:
                raise DigestMismatch(f"{where}: the archive unpacks to more than {max_bytes} "
                                     "bytes, over the cap (source_options."
                                     "max_unpacked_bytes): refused")
            raise DiskFull(f"{where}: the archive unpacks to more than {most} bytes, the "
                           "most the disk budget can ever hold for it: refused")
        entries.append((name, size, opener))
    return entries, total


def _copy(src: IO[bytes], target: Path, size: int, where: str, name: str,
          stop: threading.Event | None) -> None:
    written = 0
    with src, open(target, "xb") as out:
        while chunk := src.read(_CHUNK):
            if stop is not None and stop.is_set():
                raise PullStopped(f"pull of {where} stopped")
            written += len(chunk)
            if written > size:
                raise DigestMismatch(f"{where}: archive entry {name[:200]!r} is longer "
                                     "than it says")
            out.write(chunk)


@contextlib.contextmanager
def _open(archive: Path, kind: str) -> Iterator[Iterator[_Entry]]:
    """The archive's entries in order, read as they are asked for, the archive open
    while the caller reads them."""
    if kind == "zip":
        with zipfile.ZipFile(archive) as zf:
            yield (_zip_entry(zf, info) for info in zf.infolist())
        return
    with tarfile.open(archive, "r:*") as tf:
        yield (_tar_entry(tf, m) for m in tf)


def _zip_entry(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> _Entry:
    why = "a link" if stat.S_ISLNK(info.external_attr >> 16) else None
    return (info.filename, why, info.file_size,
            None if info.is_dir() else (lambda: zf.open(info)))


def _tar_entry(tf: tarfile.TarFile, m: tarfile.TarInfo) -> _Entry:
    why = ("a link" if m.issym() or m.islnk() else None if m.isfile() or m.isdir()
           else "not a regular file or directory")
    return (m.name, why, m.size if m.isfile() else 0,
            (lambda: tf.extractfile(m)) if m.isfile() else None)


def _check(where: str, name: str, why: str | None) -> str:
    """The entry's safe name, or a DigestMismatch naming it."""
    stripped = name.rstrip("/")
    parts = PurePosixPath(stripped).parts
    if why is None and (not stripped or stripped.startswith("/") or "\\" in stripped
                        or any(p == ".." for p in parts) or ":" in parts[0]):
        why = "an absolute or '..' path"
    if why is not None:
        raise DigestMismatch(f"{where}: archive entry {name[:200]!r} refused: {why}")
    return str(PurePosixPath(*[p for p in parts if p != "."]) or ".")
