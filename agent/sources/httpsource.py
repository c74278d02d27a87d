"""``https://host/path/file#sha256=<hex>`` (and ``http://`` on loopback or with
``insecure: true``): one file, or one archive unpacked, as one version. The sha256 is
required over https and always checked; an interrupted pull resumes with ``Range``;
TLS is verified (``ca_file`` adds a CA), never switched off. Redirects are followed
only as ``agent.sources.web`` allows (https; http where the URL itself is http)."""

from __future__ import annotations

import contextlib
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import Any

from agent.security.exposure import is_loopback
from agent.sources.archive import archive_kind
from agent.sources.errors import SourceError, SourceNotFound, SourceUnavailable, http_error
from agent.sources.transfer import CHUNK, BaseSource, RemoteFile, Stream, check_digest
from agent.sources.web import opener


class HttpSource(BaseSource):
    """One URL as version ``version`` (default 1)."""

    def __init__(self, url: urllib.parse.SplitResult, *, version: int = 1,
                 sha256: str | None = None, ca_file: str | None = None,
                 insecure: bool = False, timeout_s: float = 30.0,
                 archive: str | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        host = url.hostname or ""
        self.display_url = urllib.parse.urlunsplit(
            (url.scheme, host if url.port is None else f"{host}:{url.port}", url.path, "", ""))
        if url.username or url.password:
            raise SourceError(f"{self.display_url}: credentials in the URL are refused "
                              "(use a signed URL's query string)")
        if url.scheme == "http" and not (is_loopback(host) or insecure):
            raise SourceError(f"{self.display_url}: plain http only to loopback; use https "
                              "or set source_options.insecure: true")
        fragment = dict(urllib.parse.parse_qsl(url.fragment))
        digest = sha256 or fragment.get("sha256")
        if digest is None and url.scheme == "https":
            raise SourceError(f"{self.display_url}: https sources need the file's sha256: "
                              "add #sha256=<hex> to the URL or set source_options.sha256")
        self.digest = None if digest is None else check_digest(
            digest if digest.startswith("sha256:") else f"sha256:{digest}", self.display_url)
        self.version = version
        self.timeout_s = timeout_s
        self.name = PurePosixPath(urllib.parse.unquote(url.path)).name or "download"
        self.archive = archive if archive is not None else archive_kind(self.name)
        if self.archive == "none":
            self.archive = None
        self._url = urllib.parse.urlunsplit(url._replace(fragment=""))
        self._opener = opener(self.display_url,
                              context=ssl.create_default_context(cafile=ca_file),
                              plain_http=url.scheme == "http")

    def versions(self) -> list[int]:
        return [self.version]

    def files(self, version: int) -> list[RemoteFile]:
        self._check_version(version)
        # a one-byte GET, not HEAD: a signed URL is often signed for GET only
        with self._request(0, last=0) as resp:
            total = _total_size(resp)
        return [RemoteFile(self.name, total, self.digest)]

    @contextlib.contextmanager
    def open(self, version: int, file: RemoteFile, offset: int) -> Iterator[Stream]:
        self._check_version(version)
        with self._request(offset) as resp:
            start = offset if resp.status == 206 and _range_start(resp) == offset else 0
            yield Stream(start, iter(lambda: resp.read1(CHUNK), b""))

    def version_digest(self, version: int, sums: str) -> str:
        return "sha256:" + sums.split()[0]

    def _check_version(self, version: int) -> None:
        if version != self.version:
            raise SourceNotFound(f"{self.display_url}: holds version {self.version} only, "
                                 f"not {version}")

    @contextlib.contextmanager
    def _request(self, first: int, last: int | None = None) -> Iterator[Any]:
        headers = {"Accept-Encoding": "identity"}
        if first or last is not None:
            headers["Range"] = f"bytes={first}-{'' if last is None else last}"
        try:
            resp = self._urlopen(headers)
        except SourceError as exc:
            if not (first and getattr(exc, "http_code", None) == 416):
                raise
            # the partial is longer than the file: from the start
            resp = self._urlopen({"Accept-Encoding": "identity"})
        with resp:
            yield resp

    def _urlopen(self, headers: dict[str, str]) -> Any:
        try:
            resp = self._opener.open(urllib.request.Request(self._url, headers=headers),
                                     timeout=self.timeout_s)
        except urllib.error.HTTPError as exc:
            exc.close()
            err = http_error(self.display_url, exc.code)
            err.http_code = exc.code  # type: ignore[attr-defined]
            raise err from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, ssl.SSLError):
                raise SourceError(
                    f"{self.display_url}: TLS verification failed "
                    f"({getattr(reason, 'reason', None) or type(reason).__name__}); "
                    "source_options.ca_file names the CA") from None
            raise SourceUnavailable(f"{self.display_url}: unreachable "
                                    f"({type(reason).__name__})") from None
        return resp


def _range_start(resp: Any) -> int | None:
    value = resp.headers.get("Content-Range", "")
    try:
        return int(value.split()[1].split("-")[0])
    except (IndexError, ValueError):
        return None


def _total_size(resp: Any) -> int:
    if resp.status == 206:
        total = resp.headers.get("Content-Range", "").rpartition("/")[2]
        return int(total) if total.isdigit() else -1
    length = resp.headers.get("Content-Length")
    return int(length) if length and length.isdigit() else -1
