"""A minimal OCI registry (distribution API v2) client on urllib: bearer-token and
basic auth from the registry's ``WWW-Authenticate`` challenge, credentials from the
options or the docker ``config.json``, blobs and manifests read and written. The
Authorization header never follows a redirect (a blob store's signed URL) and no
credential or token reaches a message. Every URL the registry hands back (its token
realm, a redirect, a next page, an upload location) is fetched only as
``agent.sources.web`` allows: https, or http where the registry itself is plain http."""

from __future__ import annotations

import base64
import json
import os
import re
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from agent.sources.errors import SourceDenied, SourceError, SourceUnavailable, http_error
from agent.sources.web import check_url, opener, read_bounded

MANIFEST_TYPES = ("application/vnd.oci.image.manifest.v1+json",
                  "application/vnd.docker.distribution.manifest.v2+json")
_PARAM = re.compile(r'(\w+)="([^"]*)"')
#: The most bytes of a token service's answer read.
TOKEN_BYTES = 1 << 20


def docker_credentials(host: str, config: str | None) -> tuple[str, str] | None:
    """(user, password) for ``host`` from a docker ``config.json`` (``config``, else
    ``$DOCKER_CONFIG/config.json``, else ``~/.docker/config.json``); None where it has
    none. Credential helpers (``credsStore``) are not run."""
    path = Path(config) if config else Path(
        os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "config.json"
    try:
        auths = json.loads(path.read_text()).get("auths", {})
    except FileNotFoundError:
        return None
    except (OSError, ValueError, AttributeError):
        raise SourceError(f"{path}: not a readable docker config.json") from None
    for key, entry in auths.items() if isinstance(auths, dict) else ():
        name = urllib.parse.urlsplit(key).netloc if "://" in key else key.split("/")[0]
        if name == host and isinstance(entry, dict) and entry.get("auth"):
            try:
                user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
            except ValueError:
                raise SourceError(f"{path}: the auth entry for {host} is not base64 "
                                  "user:password") from None
            return user, password
    return None


class RegistryClient:
    """One repository of one registry, over ``base`` (``http(s)://host[:port]``)."""

    def __init__(self, base: str, repository: str, where: str, *,
                 credentials: tuple[str, str] | None, ca_file: str | None,
                 timeout_s: float, clock: Any = time.monotonic) -> None:
        self.base = base
        self.repository = repository
        self.where = where
        #: The registry is plain http (loopback or ``insecure``): so may its URLs be.
        self.plain_http = base.startswith("http:")
        self._credentials = credentials
        self._opener = opener(where, context=ssl.create_default_context(cafile=ca_file),
                              plain_http=self.plain_http)
        self.timeout_s = timeout_s
        self.clock = clock
        self._auth: str | None = None
        self._lock = threading.Lock()

    def url(self, path: str) -> str:
        return f"{self.base}/v2/{self.repository}/{path}"

    def join(self, link: str, what: str) -> str:
        """A URL the registry handed back (relative to it or absolute), checked."""
        return check_url(urllib.parse.urljoin(self.base, link), self.where, what,
                         plain_http=self.plain_http)

    def read(self, resp: Any, limit: int, deadline: float, what: str) -> bytes:
        """``resp``'s whole body within ``limit`` bytes and by ``deadline``."""
        return read_bounded(resp, limit, deadline, self.where, what, clock=self.clock)

    def _timeout(self, deadline: float | None) -> float:
        if deadline is None:
            return self.timeout_s
        left = deadline - self.clock()
        if left <= 0:
            raise self._late()
        return min(self.timeout_s, left)

    def _late(self) -> SourceUnavailable:
        return SourceUnavailable(f"{self.where}: the registry did not answer in time "
                                 "(a listing, manifest or token has a deadline): refused")

    def request(self, method: str, url: str, *, headers: dict[str, str] | None = None,
                data: Any = None, ok: tuple[int, ...] = (200,),
                deadline: float | None = None) -> Any:
        """The open response to ``method url`` (authenticating once on a 401); a
        SourceError by status otherwise (404: SourceNotFound). ``deadline`` (on
        ``clock``): no read waits past it."""
        check_url(url, self.where, "the URL", plain_http=self.plain_http)
        for attempt in (0, 1):
            req = urllib.request.Request(url, method=method, data=data, headers=headers or {})
            with self._lock:
                auth = self._auth
            same_host = urllib.parse.urlsplit(url).netloc == urllib.parse.urlsplit(self.base).netloc
            if auth and same_host:
                req.add_unredirected_header("Authorization", auth)
            try:
                resp = self._opener.open(req, timeout=self._timeout(deadline))
            except urllib.error.HTTPError as exc:
                challenge = exc.headers.get("WWW-Authenticate", "")
                exc.close()
                if exc.code == 401 and attempt == 0 and challenge:
                    token = self._authenticate(challenge, deadline)
                    with self._lock:
                        self._auth = token
                    if hasattr(data, "seek"):
                        data.seek(0)
                    continue
                raise http_error(self.where, exc.code, by="the registry", detail="" if (
                    self._credentials) else "; no credentials found") from None
            except (urllib.error.URLError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                if isinstance(reason, ssl.SSLError):
                    raise SourceError(f"{self.where}: TLS verification failed; "
                                      "source_options.ca_file names the CA") from None
                if deadline is not None and self.clock() >= deadline:
                    raise self._late() from None
                raise SourceUnavailable(f"{self.where}: registry unreachable "
                                        f"({type(reason).__name__})") from None
            if resp.status not in ok:
                resp.close()
                raise SourceError(f"{self.where}: unexpected HTTP {resp.status} to {method}")
            return resp
        raise SourceDenied(f"{self.where}: the registry refused the credentials")

    def _authenticate(self, challenge: str, deadline: float | None) -> str:
        """The Authorization value a ``WWW-Authenticate`` challenge asks for (a token
        from its realm, which must be a URL ``check_url`` allows)."""
        scheme, _, rest = challenge.partition(" ")
        params = dict(_PARAM.findall(rest))
        basic = None if self._credentials is None else "Basic " + base64.b64encode(
            ":".join(self._credentials).encode()).decode()
        if scheme.lower() == "basic":
            if basic is None:
                raise SourceDenied(f"{self.where}: the registry wants a login: set "
                                   "source_options username/password or docker login")
            return basic
        if scheme.lower() != "bearer" or "realm" not in params:
            raise SourceError(f"{self.where}: unsupported registry auth {scheme[:20]!r}")
        query = {k: params[k] for k in ("service", "scope") if k in params}
        realm = check_url(params["realm"], self.where, "the registry's token realm",
                          plain_http=self.plain_http)
        url = realm + ("&" if "?" in realm else "?") + urllib.parse.urlencode(query)
        req = urllib.request.Request(url)
        if basic:
            req.add_unredirected_header("Authorization", basic)
        if deadline is None:
            deadline = self.clock() + self.timeout_s
        try:
            with self._opener.open(req, timeout=self._timeout(deadline)) as resp:
                body = json.loads(self.read(resp, TOKEN_BYTES, deadline,
                                            "the token service's answer"))
        except SourceError:
            raise
        except urllib.error.HTTPError as exc:
            exc.close()
            raise SourceDenied(f"{self.where}: the registry's token service refused "
                               f"(HTTP {exc.code})") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise SourceUnavailable(f"{self.where}: the registry's token service failed "
                                    f"({type(exc).__name__})") from None
        token = body.get("token") or body.get("access_token") if isinstance(body, dict) else None
        if not isinstance(token, str) or not token:
            raise SourceDenied(f"{self.where}: the registry's token service gave no token")
        return f"Bearer {token}"
