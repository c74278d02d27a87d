"""``oci://registry[:port]/repository[:tag|@sha256:...]``: a model stored in an OCI
registry as ORAS writes it, an image manifest whose layers are the version's files
(the ``org.opencontainers.image.title`` annotation is each file's path). The
repository's numeric tags are its versions (or the one tag or digest given); every
blob is checked against its digest. ``push`` writes such an artifact.

A registry cannot hold a pull up: a listing reads at most ``MAX_TAG_PAGES`` pages and
ends within ``deadline_s``, as a manifest (at most ``MANIFEST_BYTES``) does."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agent.security.exposure import is_loopback
from agent.sources.errors import DigestMismatch, SourceError, SourceNotFound, SourceUnavailable
from agent.sources.ociregistry import MANIFEST_TYPES, RegistryClient, docker_credentials
from agent.sources.transfer import CHUNK, BaseSource, RemoteFile, Stream, check_digest

TITLE = "org.opencontainers.image.title"
ARTIFACT_TYPE = "application/vnd.edgeagent.model.v1"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"  # ORAS's default for a file
EMPTY_CONFIG = b"{}"
EMPTY_TYPE = "application/vnd.oci.empty.v1+json"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPOSITORY = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
#: The most pages of ``tags/list`` a listing reads (a registry's page holds 100 or more).
MAX_TAG_PAGES = 100
#: The most bytes of one page of tags, or of a manifest.
PAGE_BYTES = MANIFEST_BYTES = 4 << 20
#: Seconds a listing (all its pages) or a manifest may take, whole.
DEADLINE_S = 60.0


class OciSource(BaseSource):
    """One repository of a registry (or one tag or digest of it)."""

    def __init__(self, url: str, *, version: int | None = None, username: str | None = None,
                 password: str | None = None, docker_config: str | None = None,
                 ca_file: str | None = None, insecure: bool = False,
                 timeout_s: float = 30.0, deadline_s: float = DEADLINE_S,
                 max_pages: int = MAX_TAG_PAGES, **kw: Any) -> None:
        super().__init__(**kw)
        self.timeout_s, self.deadline_s, self.max_pages = timeout_s, deadline_s, max_pages
        rest = url.split("://", 1)[1]
        host, _, path = rest.partition("/")
        self.tag: str | None = None
        self.digest: str | None = None
        if "@" in path:
            path, _, digest = path.partition("@")
            self.digest = check_digest(digest, f"oci://{host}/{path}")
        elif ":" in path.rpartition("/")[2]:
            path, _, self.tag = path.rpartition(":")
        ref = f"@{self.digest}" if self.digest else f":{self.tag}" if self.tag else ""
        self.display_url = f"oci://{host}/{path}{ref}"
        if "@" in host or not host or not _REPOSITORY.match(path) or (
                self.tag is not None and not _TAG.match(self.tag)):
            raise SourceError(f"source {self.display_url!r}: expected "
                              "oci://registry[:port]/repository[:tag|@sha256:<hex>]")
        if (username is None) != (password is None):
            raise SourceError("source_options: username and password go together")
        self.version = version if version is not None else (
            int(self.tag) if self.tag and self.tag.isdigit() else 1)
        hostname = urllib.parse.urlsplit(f"//{host}").hostname or ""
        plain = (is_loopback(hostname) or insecure) and not ca_file
        credentials = (username, password) if username is not None else docker_credentials(
            host, docker_config)
        self.client = RegistryClient(f"{'http' if plain else 'https'}://{host}", path,
                                     self.display_url, credentials=credentials,
                                     ca_file=ca_file, timeout_s=timeout_s, clock=self._clock)
        self._manifests: dict[int, str] = {}

    # -- listing ----------------------------------------------------------------------

    def versions(self) -> list[int]:
        if self.tag or self.digest:
            return [self.version]
        tags: list[str] = []
        url = self.client.url("tags/list")
        deadline = self._clock() + self.deadline_s
        for page in range(self.max_pages):
            with self.client.request("GET", url, deadline=deadline) as resp:
                body = _json(self.client.read(resp, PAGE_BYTES, deadline,
                                              "a page of its tags"), self.display_url)
                link = resp.headers.get("Link", "")
            tags += [t for t in body.get("tags") or [] if isinstance(t, str)]
            match = re.match(r"<([^>]+)>", link)
            if not match:
                return sorted(int(t) for t in tags if t.isdigit())
            url = self.client.join(match.group(1), "the next page of tags at")
            if self._clock() > deadline:
                raise SourceUnavailable(f"{self.display_url}: listing its tags did not end "
                                        f"in time ({self.deadline_s:g} s, {page + 1} pages): "
                                        "refused")
        raise SourceError(f"{self.display_url}: the registry's tag list runs past "
                          f"{self.max_pages} pages: refused (a registry that pages "
                          "without end)")

    def files(self, version: int) -> list[RemoteFile]:
        manifest, digest = self._manifest(version)
        layers = manifest.get("layers")
        if not isinstance(layers, list) or not layers:
            raise SourceError(f"{self.display_url}: version {version}'s manifest has no layers")
        out = []
        for layer in layers:
            title = (layer.get("annotations") or {}).get(TITLE) if isinstance(layer, dict) else None
            if not isinstance(title, str) or not isinstance(layer.get("size"), int) or \
                    not isinstance(layer.get("digest"), str):
                raise SourceError(f"{self.display_url}: a layer without a {TITLE} annotation, "
                                  "size or digest: not a model artifact (push one with "
                                  "`edgeagent model push`)")
            out.append(RemoteFile(title, layer["size"],
                                  check_digest(layer["digest"], self.display_url)))
        self._manifests[version] = digest
        return out

    def _ref(self, version: int) -> str:
        if self.tag or self.digest:
            if version != self.version:
                raise SourceNotFound(f"{self.display_url}: holds version {self.version} only, "
                                     f"not {version}")
            return self.digest or self.tag or ""
        return str(version)

    def _manifest(self, version: int) -> tuple[dict, str]:
        ref = self._ref(version)
        deadline = self._clock() + self.deadline_s
        try:
            resp = self.client.request("GET", self.client.url(f"manifests/{ref}"),
                                       headers={"Accept": ", ".join(MANIFEST_TYPES)},
                                       deadline=deadline)
        except SourceNotFound:
            raise SourceNotFound(f"{self.display_url}: no version {version} "
                                 f"(tag or digest {ref})") from None
        with resp:
            raw = self.client.read(resp, MANIFEST_BYTES, deadline,
                                   f"version {version}'s manifest")
        digest = "sha256:" + hashlib.sha256(raw).hexdigest()
        if self.digest and digest != self.digest:
            raise DigestMismatch(f"{self.display_url}: the manifest's bytes do not match "
                                 f"{self.digest}")
        try:
            manifest = json.loads(raw)
        except ValueError:
            raise SourceError(f"{self.display_url}: the manifest is not JSON") from None
        if not isinstance(manifest, dict) or manifest.get("mediaType", MANIFEST_TYPES[0]) \
                not in MANIFEST_TYPES:
            raise SourceError(f"{self.display_url}: not an image manifest (an index or "
                              "another type): a model artifact has one manifest")
        return manifest, digest

    # -- reading ----------------------------------------------------------------------

    @contextlib.contextmanager
    def open(self, version: int, file: RemoteFile, offset: int) -> Iterator[Stream]:
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        with self.client.request("GET", self.client.url(f"blobs/{file.digest}"),
                                 headers=headers, ok=(200, 206)) as resp:
            start = offset if resp.status == 206 and resp.headers.get(
                "Content-Range", "").startswith(f"bytes {offset}-") else 0
            yield Stream(start, iter(lambda: resp.read1(CHUNK), b""))

    def version_digest(self, version: int, sums: str) -> str:
        return self._manifests.get(version) or super().version_digest(version, sums)

    # -- writing ----------------------------------------------------------------------

    def push(self, src: Path, tag: str | None = None) -> str:
        """Upload the files under ``src`` as an artifact tagged ``tag`` (default: the
        URL's tag, else ``str(version)``); the manifest's digest."""
        tag = tag or self.tag or str(self.version)
        if not _TAG.match(tag):
            raise SourceError(f"{self.display_url}: bad tag {tag!r}")
        layers = []
        for path in sorted(p for p in src.rglob("*") if p.is_file()):
            digest, size = _file_digest(path)
            self._upload(digest, size, path)
            layers.append({"mediaType": LAYER_TYPE, "digest": digest, "size": size,
                           "annotations": {TITLE: path.relative_to(src).as_posix()}})
        if not layers:
            raise SourceError(f"{src}: no files to push")
        config_digest = "sha256:" + hashlib.sha256(EMPTY_CONFIG).hexdigest()
        self._upload(config_digest, len(EMPTY_CONFIG), None)
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": MANIFEST_TYPES[0], "artifactType": ARTIFACT_TYPE,
            "config": {"mediaType": EMPTY_TYPE, "digest": config_digest,
                       "size": len(EMPTY_CONFIG)},
            "layers": layers}).encode()
        with self.client.request("PUT", self.client.url(f"manifests/{tag}"), data=manifest,
                                 headers={"Content-Type": MANIFEST_TYPES[0]}, ok=(201,)):
            pass
        return "sha256:" + hashlib.sha256(manifest).hexdigest()

    def _upload(self, digest: str, size: int, path: Path | None) -> None:
        """One blob, unless the registry has it: a monolithic upload, streamed."""
        try:
            with self.client.request("HEAD", self.client.url(f"blobs/{digest}")):
                return
        except SourceNotFound:
            pass
        with self.client.request("POST", self.client.url("blobs/uploads/"), data=b"",
                                 ok=(202,)) as resp:
            location = self.client.join(resp.headers.get("Location", ""),
                                        "the upload location")
        put = location + ("&" if "?" in location else "?") + urllib.parse.urlencode(
            {"digest": digest})
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
        with contextlib.ExitStack() as stack:
            body: Any = EMPTY_CONFIG if path is None else stack.enter_context(open(path, "rb"))
            with self.client.request("PUT", put, data=body, headers=headers, ok=(201,)):
                pass


def _file_digest(path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while data := f.read(CHUNK):
            h.update(data)
            size += len(data)
    return f"sha256:{h.hexdigest()}", size


def _json(raw: bytes, where: str) -> dict:
    try:
        body = json.loads(raw)
    except ValueError:
        raise SourceError(f"{where}: the registry's answer is not JSON") from None
    return body if isinstance(body, dict) else {}
