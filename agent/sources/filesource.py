"""``file:///abs/path``: a directory laid out as a local model directory (``1/``,
``2/``, ... holding the files), typically on NFS. A version's ``SHA256SUMS`` (the
``sha256sum`` output format), where present, gives each file's digest."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agent.sources.errors import SourceError, SourceNotFound, SourceUnavailable
from agent.sources.transfer import CHUNK, BaseSource, RemoteFile, Stream, safe_relpath

MANIFEST = "SHA256SUMS"


class FileSource(BaseSource):
    """A version directory tree on a (network) file system."""

    def __init__(self, root: Path, **kw: Any) -> None:
        super().__init__(**kw)
        self.root = root
        self.display_url = root.as_uri()

    def versions(self) -> list[int]:
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            raise SourceNotFound(f"{self.display_url}: no such directory") from None
        except OSError as exc:
            raise SourceUnavailable(f"{self.display_url}: cannot list ({exc.strerror})") from None
        return sorted(int(n) for n in names if n.isdigit() and (self.root / n).is_dir())

    def files(self, version: int) -> list[RemoteFile]:
        vdir = self.root / str(version)
        if not vdir.is_dir():
            raise SourceNotFound(f"{self.display_url}: no version {version}")
        sums = _read_sums(vdir / MANIFEST, self.display_url)
        out = []
        for dirpath, dirnames, filenames in os.walk(vdir):
            dirnames.sort()
            for name in sorted(filenames):
                path = Path(dirpath) / name
                rel = path.relative_to(vdir).as_posix()
                if rel == MANIFEST or not path.is_file():
                    continue
                out.append(RemoteFile(rel, path.stat().st_size, sums.get(rel)))
        return out

    @contextlib.contextmanager
    def open(self, version: int, file: RemoteFile, offset: int) -> Iterator[Stream]:
        path = self.root / str(version) / file.path
        try:
            f = open(path, "rb")
        except FileNotFoundError:
            raise SourceNotFound(f"{self.display_url}: {file.path} is gone") from None
        except OSError as exc:
            raise SourceUnavailable(f"{self.display_url}: {file.path}: {exc.strerror}") from None
        with f:
            f.seek(offset)
            yield Stream(offset, iter(lambda: f.read(CHUNK), b""))


def _read_sums(path: Path, where: str) -> dict[str, str]:
    """``SHA256SUMS`` as {relative path: "sha256:<hex>"}; empty where there is none."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    sums = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        digest, sep, name = line.partition("  ")
        if not sep:
            digest, sep, name = line.partition(" *")
        digest = digest.strip().lower()
        if not sep or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise SourceError(f"{where}: {path.parent.name}/{MANIFEST} line {n}: expected "
                              "'<sha256 hex>  <path>'")
        sums[safe_relpath(name.strip().removeprefix("./"), where)] = f"sha256:{digest}"
    return sums
