"""A minimal OCI registry (distribution API v2) client on urllib: bearer-token and
basic auth from the registry's ``WWW-Authenticate`` challenge, credentials from the
options or the docker ``config.json``, blobs and manifests read and written. The
Authorization header never follows a redirect (a blob store's signed URL) and no
credential or token reaches a message."""

from __future__ import annotations

import base64
import json
import os
import re
import ssl
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from agent.sources.errors import SourceDenied, SourceError, SourceUnavailable, http_error

MANIFEST_TYPES = ("application/vnd.oci.image.manifest.v1+json",
                  "application/vnd.docker.distribution.manifest.v2+json")
_PARAM = re.compile(r'(\w+)="([^"]*)"')


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
                 timeout_s: float) -> None:
        self.base = base
        self.repository = repository
        self.where = where
        self._credentials = credentials
        self._context = ssl.create_default_context(cafile=ca_file) if base.startswith(
            "https:") else None
        self._timeout = timeout_s
        self._auth: str | None = None
        self._lock = threading.Lock()

    def url(self, path: str) -> str:
        return f"{self.base}/v2/{self.repository}/{path}"

    def request(self, method: str, url: str, *, headers: dict[str, str] | None = None,
                data: Any = None, ok: tuple[int, ...] = (200,)) -> Any:
        """The open response to ``method url`` (authenticating once on a 401); a
        SourceError by status otherwise (404: SourceNotFound)."""
        for attempt in (0, 1):
            req = urllib.request.Request(url, method=method, data=data, headers=headers or {})
            with self._lock:
                auth = self._auth
            same_host = urllib.parse.urlsplit(url).netloc == urllib.parse.urlsplit(self.base).netloc
            if auth and same_host:
                req.add_unredirected_header("Authorization", auth)
            try:
                resp = urllib.request.urlopen(req, timeout=self._timeout, context=self._context)
            except urllib.error.HTTPError as exc:
                challenge = exc.headers.get("WWW-Authenticate", "")
                exc.close()
                if exc.code == 401 and attempt == 0 and challenge:
                    token = self._authenticate(challenge)
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
                raise SourceUnavailable(f"{self.where}: registry unreachable "
                                        f"({type(reason).__name__})") from None
            if resp.status not in ok:
                resp.close()
                raise SourceError(f"{self.where}: unexpected HTTP {resp.status} to {method}")
            return resp
        raise SourceDenied(f"{self.where}: the registry refused the credentials")

    def _authenticate(self, challenge: str) -> str:
        """The Authorization value a ``WWW-Authenticate`` challenge asks for."""
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
        realm = params["realm"]
        url = realm + ("&" if "?" in realm else "?") + urllib.parse.urlencode(query)
        req = urllib.request.Request(url)
        if basic:
            req.add_unredirected_header("Authorization", basic)
        try:
            context = self._context if url.startswith("https:") else None
            with urllib.request.urlopen(req, timeout=self._timeout, context=context) as resp:
                body = json.loads(resp.read(1 << 20))
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
