"""Where models come from: ``open_source(url, options)`` lists a remote place's numeric
versions and pulls one into a local version directory, verified, resumable and renamed
into place in one step (``file://``, ``http(s)://``, ``s3://``, ``oci://``).

A shared leaf: imports no node, coordinator, backend or command module. The heavy or
optional clients (boto3) are imported by the scheme that needs them, when it is opened.
"""

from __future__ import annotations

import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from agent.sources.archive import Allowance
from agent.sources.errors import (DigestMismatch, DiskFull, NeedsRoom, PullStopped,
                                  SourceDenied, SourceError, SourceNotFound, SourceUnavailable)
from agent.sources.transfer import PullResult, RemoteFile, free_bytes, partial_dir
from agent.sources.web import redact_url

__all__ = ["Allowance", "DigestMismatch", "DiskFull", "NeedsRoom", "PullResult", "PullStopped",
           "RemoteFile", "SCHEMES",
           "Source", "SourceDenied", "SourceError", "SourceNotFound", "SourceUnavailable",
           "open_source", "partial_dir", "redact_url"]

#: The URL schemes ``open_source`` takes.
SCHEMES = ("file", "http", "https", "s3", "oci")


class Source(Protocol):
    """A remote place holding a model's numeric versions."""

    #: Safe to log: no credentials, query string or signature.
    display_url: str

    def versions(self) -> list[int]: ...

    def files(self, version: int) -> list[RemoteFile]: ...

    def pull(self, version: int, dest: Path, *, progress: Callable[[int], None] | None = None,
             stop: threading.Event | None = None, bandwidth_bps: int | None = None,
             allowance: Allowance | None = None) -> PullResult: ...


#: Each scheme's options: name -> (type, what it is); checked by ``open_source``.
OPTIONS: dict[str, dict[str, tuple[type | tuple[type, ...], str]]] = {
    "file": {},
    "http": {"version": (int, "the version the URL's file is"),
             "sha256": (str, "the file's sha256 (else #sha256=<hex> in the URL)"),
             "ca_file": (str, "a PEM file of CAs to trust besides the system's"),
             "insecure": (bool, "allow plain http beyond loopback"),
             "timeout_s": ((int, float), "seconds a connect or read may take"),
             "archive": (str, "tar, zip or none (else from the file name)"),
             "max_unpacked_bytes": ((int, str), "the cap on an archive's unpacked size"),
             "max_unpacked_entries": (int, "the cap on an archive's entries")},
    "s3": {"endpoint_url": (str, "the S3-compatible store's URL (MinIO, Ceph, moto)"),
           "region": (str, "the bucket's region"),
           "ca_file": (str, "a PEM file of CAs to trust besides the system's"),
           "timeout_s": ((int, float), "seconds a connect or read may take")},
    "oci": {"version": (int, "the version a tag or digest reference is"),
            "username": (str, "registry user (else ~/.docker/config.json)"),
            "password": (str, "registry password or token"),
            "docker_config": (str, "the docker config.json to read credentials from"),
            "ca_file": (str, "a PEM file of CAs to trust besides the system's"),
            "insecure": (bool, "allow plain http beyond loopback"),
            "timeout_s": ((int, float), "seconds a connect or read may take")},
}
OPTIONS["https"] = OPTIONS["http"]


def open_source(url: str, options: Mapping[str, Any] | None = None, *,
                clock: Callable[[], float] = time.monotonic,
                sleep: Callable[[float], object] | None = None,
                disk_free: Callable[[Path], int] = free_bytes) -> Source:
    """The source ``url`` names, with its scheme's ``options``; a SourceError (400)
    naming the problem for a bad URL or option. ``clock``/``sleep`` time pulls and the
    bandwidth cap; ``disk_free`` reports free room (tests inject less)."""
    if not isinstance(url, str) or not url:
        raise SourceError("source: expected a URL such as s3://bucket/prefix")
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - a bad port raises here
    except ValueError:
        raise SourceError(f"source {redact_url(url)!r}: not a URL") from None
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise SourceError(f"source {redact_url(url)!r}: unknown scheme {scheme!r}; expected "
                          f"one of {', '.join(s + '://' for s in SCHEMES)}")
    opts = _check_options(scheme, dict(options or {}), redact_url(url))
    kw = dict(clock=clock, sleep=sleep, disk_free=disk_free)
    if "max_unpacked_bytes" in opts:
        from agent.units import parse_size

        try:
            kw["max_unpacked_bytes"] = parse_size(opts.pop("max_unpacked_bytes"))
        except ValueError as exc:
            raise SourceError(f"source_options.max_unpacked_bytes: {exc}") from None
    if "max_unpacked_entries" in opts:
        kw["max_unpacked_entries"] = opts.pop("max_unpacked_entries")
    if scheme == "file":
        from agent.sources.filesource import FileSource

        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise SourceError(f"source {redact_url(url)!r}: expected file:///absolute/path")
        return FileSource(Path(urllib.parse.unquote(parts.path)), **kw)
    if scheme in ("http", "https"):
        from agent.sources.httpsource import HttpSource

        if not parts.hostname:
            raise SourceError(f"source {redact_url(url)!r}: no host")
        return HttpSource(parts, **opts, **kw)
    if scheme == "s3":
        from agent.sources.s3source import S3Source

        return S3Source(parts, **opts, **kw)
    from agent.sources.ocisource import OciSource

    return OciSource(url, **opts, **kw)


def _check_options(scheme: str, opts: dict[str, Any], where: str) -> dict[str, Any]:
    known = OPTIONS[scheme]
    unknown = sorted(set(opts) - set(known))
    if unknown:
        raise SourceError(f"source_options: unknown option(s) {', '.join(map(str, unknown))} for "
                          f"{scheme}:// (known: {', '.join(known) or 'none'})")
    for name, value in opts.items():
        kind, what = known[name]
        if isinstance(value, bool) and kind is not bool:
            ok = False
        else:
            ok = isinstance(value, kind)
        positive = name in ("version", "timeout_s", "max_unpacked_entries")
        if not ok or (positive and value <= 0):
            raise SourceError(f"source_options.{name}: expected {what} "
                              f"({'a positive number' if positive else _name(kind)}), "
                              f"got {type(value).__name__}")
    return opts


def _name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)
