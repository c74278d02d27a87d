"""The URLs a source that speaks HTTP fetches, and how: http(s) only, never a scheme
that reads local files (``file:``, ``ftp:``, ``data:``); plain http only where the
source itself is plain http (on loopback, or ``insecure: true``); the same rule for
every URL a server hands back (a token realm, a redirect, a next page, an upload
location), a redirect checked before it is followed; answers read within a byte cap
and a deadline. ``redact_url`` says a URL safely."""

from __future__ import annotations

import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from agent.sources.errors import SourceError, SourceUnavailable


def redact_url(url: str) -> str:
    """``url`` without credentials, query string or fragment: safe for a message."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        netloc = host if parts.port is None else f"{host}:{parts.port}"
    except ValueError:
        return "<unparsable URL>"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def check_url(url: str, where: str, what: str, *, plain_http: bool) -> str:
    """``url`` when it may be fetched: https, or http where ``plain_http``; else a
    SourceError naming ``what`` it is and the URL (redacted)."""
    try:
        scheme = urllib.parse.urlsplit(url).scheme.lower()
    except ValueError:
        scheme = ""
    if scheme == "https" or (scheme == "http" and plain_http):
        return url
    allowed = "http(s)" if plain_http else "https"
    raise SourceError(f"{where}: {what} {redact_url(url)!r} refused: only {allowed} URLs "
                      "are fetched (never one that reads local files)")


class _CheckedRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to a URL ``check_url`` allows (checked before urllib's
    own rule, so that the refusal names the URL)."""

    def __init__(self, where: str, plain_http: bool) -> None:
        super().__init__()
        self.where, self.plain_http = where, plain_http

    def http_error_302(self, req: Any, fp: Any, code: int, msg: str, headers: Any) -> Any:
        location = headers.get("location") or headers.get("uri")
        if location:
            check_url(urllib.parse.urljoin(req.full_url, location), self.where,
                      f"the server's redirect (HTTP {code}) to", plain_http=self.plain_http)
        return super().http_error_302(req, fp, code, msg, headers)

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302


def opener(where: str, *, context: Any, plain_http: bool) -> urllib.request.OpenerDirector:
    """A urllib opener that speaks http(s) only (no file, ftp or data handler) and
    follows only redirects ``check_url`` allows; proxies from the environment as
    ``urlopen``'s."""
    director = urllib.request.OpenerDirector()
    for handler in (urllib.request.ProxyHandler(), urllib.request.UnknownHandler(),
                    urllib.request.HTTPHandler(), urllib.request.HTTPSHandler(context=context),
                    urllib.request.HTTPDefaultErrorHandler(),
                    _CheckedRedirects(where, plain_http), urllib.request.HTTPErrorProcessor()):
        director.add_handler(handler)
    return director


def read_bounded(resp: Any, limit: int, deadline: float, where: str, what: str, *,
                 clock: Callable[[], float] = time.monotonic) -> bytes:
    """The whole body of ``resp``: a SourceError past ``limit`` bytes (an answer that
    does not end), SourceUnavailable once ``clock()`` passes ``deadline`` (one that
    drips)."""
    parts, got = [], 0
    while chunk := resp.read1(min(limit + 1 - got, 1 << 16)):
        parts.append(chunk)
        got += len(chunk)
        if got > limit:
            raise SourceError(f"{where}: {what} is over {limit} bytes: refused")
        if clock() > deadline:
            raise SourceUnavailable(f"{where}: {what} did not arrive in time (a server "
                                    "that drips its answer): refused")
    return b"".join(parts)
