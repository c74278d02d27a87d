"""A downloaded archive (.tar, .tar.gz/.tgz, .zip) unpacked as a version directory,
safely: regular files and directories only (no links, devices or absolute or ``..``
paths), within a size cap and the disk's free room, streamed in chunks."""

from __future__ import annotations

import contextlib
import stat
import tarfile
import threading
import zipfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import IO

from agent.sources.errors import DigestMismatch, DiskFull, PullStopped

_CHUNK = 1 << 20


def archive_kind(name: str) -> str | None:
    """"tar" or "zip" for an archive's file name, else None (a plain file)."""
    lower = name.lower()
    if lower.endswith((".tar.gz", ".tgz", ".tar", ".tar.xz", ".tar.bz2")):
        return "tar"
    if lower.endswith(".zip"):
        return "zip"
    return None


def unpack(archive: Path, kind: str, dest: Path, *, where: str, max_bytes: int,
           free: Callable[[], int], stop: threading.Event | None = None) -> None:
    """Unpack ``archive`` into ``dest`` (created). A hostile entry is a DigestMismatch
    naming it (the bytes are not a model we accept); more than ``max_bytes`` or than
    ``free()`` is refused before a byte is written."""
    try:
        with _open(archive, kind) as members:
            entries = [(_check(where, *m[:3]), m[3]) for m in members]
            names = [name for (name, _), _ in entries]
            if len(set(names)) != len(names):
                raise DigestMismatch(f"{where}: the archive names an entry twice")
            total = sum(size for (_, size), _ in entries)
            if total > max_bytes:
                raise DigestMismatch(f"{where}: the archive unpacks to {total} bytes, over "
                                     f"the cap of {max_bytes} (source_options.max_unpacked_bytes)")
            room = free()
            if total > room:
                raise DiskFull(f"disk full unpacking {where}: needed {total} bytes, "
                               f"{room} free")
            dest.mkdir(parents=True)
            for (name, size), opener in entries:
                target = dest.joinpath(*PurePosixPath(name).parts)
                if opener is None:
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                _copy(opener(), target, size, where, name, stop)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error) as exc:
        raise DigestMismatch(f"{where}: not a readable {kind} archive "
                             f"({type(exc).__name__})") from None


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
def _open(archive: Path, kind: str) -> Iterator[list[tuple[str, str | None, int,
                                                           Callable[[], IO[bytes]] | None]]]:
    """The archive's entries in order: (name, why it is refused or None, size, opener
    or None for a directory), the archive open while the caller reads them."""
    if kind == "zip":
        with zipfile.ZipFile(archive) as zf:
            out = []
            for info in zf.infolist():
                mode = info.external_attr >> 16
                why = "a link" if stat.S_ISLNK(mode) else None
                out.append((info.filename, why, info.file_size,
                            None if info.is_dir() else (lambda i=info: zf.open(i))))
            yield out
        return
    with tarfile.open(archive, "r:*") as tf:
        out = []
        for m in tf.getmembers():
            why = ("a link" if m.issym() or m.islnk() else None if m.isfile() or m.isdir()
                   else "not a regular file or directory")
            out.append((m.name, why, m.size if m.isfile() else 0,
                        (lambda m=m: tf.extractfile(m)) if m.isfile() else None))
        yield out


def _check(where: str, name: str, why: str | None, size: int) -> tuple[str, int]:
    """(the entry's safe name, its size), or a DigestMismatch naming it."""
    stripped = name.rstrip("/")
    parts = PurePosixPath(stripped).parts
    if why is None and (not stripped or stripped.startswith("/") or "\\" in stripped
                        or any(p == ".." for p in parts) or ":" in parts[0]):
        why = "an absolute or '..' path"
    if why is not None:
        raise DigestMismatch(f"{where}: archive entry {name[:200]!r} refused: {why}")
    return str(PurePosixPath(*[p for p in parts if p != "."]) or "."), size
