"""``s3://bucket/prefix`` on any S3-compatible store: the numeric "directories" under
the prefix are the versions, laid out as a local model directory. Credentials come
from the standard AWS environment and config files, exactly as boto3 finds them;
each file is checked against the store's ChecksumSHA256 where it keeps one, else its
ETag (a single-part upload's MD5, or a multi-part upload's MD5 of part MD5s,
recomputed from the part size)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agent.sources.errors import (DigestMismatch, SourceDenied, SourceError, SourceNotFound,
                                  SourceUnavailable, http_error)
from agent.sources.redact import redact_loggers
from agent.sources.transfer import CHUNK, BaseSource, RemoteFile, Stream, safe_relpath

#: How the error of an agent without boto3 starts (the install hint follows).
MISSING = "s3:// sources need boto3 (the s3 extra), not installed"


class S3Source(BaseSource):
    """A bucket's prefix holding ``<version>/<files>``."""

    def __init__(self, url: urllib.parse.SplitResult, *, endpoint_url: str | None = None,
                 region: str | None = None, ca_file: str | None = None,
                 timeout_s: float = 30.0, **kw: Any) -> None:
        super().__init__(**kw)
        self.timeout_s = timeout_s
        self.bucket = url.netloc
        self.prefix = url.path.strip("/")
        self.display_url = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        if not self.bucket or url.query or "@" in self.bucket:
            raise SourceError(f"source {self.display_url!r}: expected s3://bucket/prefix")
        try:
            import boto3  # noqa: F401 - said now, not at the first pull
        except ImportError:
            from agent.extras import install_hint

            raise SourceError(f"{MISSING}: {install_hint('s3', ('boto3',))}") from None
        if endpoint_url is not None and urllib.parse.urlsplit(endpoint_url).scheme not in (
                "http", "https"):
            raise SourceError("source_options.endpoint_url: expected an http(s):// URL")
        self._config = dict(endpoint_url=endpoint_url, region=region, ca_file=ca_file,
                            timeout_s=timeout_s)
        self._client: Any = None
        self._lock = threading.Lock()
        self._multipart: dict[tuple[int, str], str] = {}

    # -- listing ----------------------------------------------------------------------

    def versions(self) -> list[int]:
        base = f"{self.prefix}/" if self.prefix else ""
        found = []
        for page in self._pages(Prefix=base, Delimiter="/"):
            for p in page.get("CommonPrefixes", []):
                name = p["Prefix"][len(base):].rstrip("/")
                if name.isdigit():
                    found.append(int(name))
        return sorted(found)

    def files(self, version: int) -> list[RemoteFile]:
        base = f"{self.prefix}/{version}/" if self.prefix else f"{version}/"
        out = []
        for page in self._pages(Prefix=base):
            for obj in page.get("Contents", []):
                if obj["Key"].endswith("/"):
                    continue  # a "folder" marker
                rel = safe_relpath(obj["Key"][len(base):], self.display_url)
                out.append(self._describe(version, rel, obj["Key"], obj["Size"]))
        if not out:
            raise SourceNotFound(f"{self.display_url}: no version {version}")
        return sorted(out, key=lambda f: f.path)

    def _describe(self, version: int, rel: str, key: str, size: int) -> RemoteFile:
        head = self._call("head_object", Bucket=self.bucket, Key=key, ChecksumMode="ENABLED")
        checksum = head.get("ChecksumSHA256")
        whole = head.get("ChecksumType", "FULL_OBJECT") == "FULL_OBJECT"
        if checksum and "-" not in checksum and whole:
            return RemoteFile(rel, size, "sha256:" + base64.b64decode(checksum).hex())
        etag = head.get("ETag", "").strip('"')
        encrypted = (head.get("ServerSideEncryption") == "aws:kms"
                     or head.get("SSECustomerAlgorithm"))
        if not etag or encrypted:  # an encrypted object's ETag is no MD5 of its bytes
            return RemoteFile(rel, size, None)
        if "-" in etag:
            self._multipart[(version, rel)] = etag
            return RemoteFile(rel, size, None)
        return RemoteFile(rel, size, f"md5:{etag}")

    # -- reading ----------------------------------------------------------------------

    @contextlib.contextmanager
    def open(self, version: int, file: RemoteFile, offset: int) -> Iterator[Stream]:
        key = self._key(version, file.path)
        extra = {"Range": f"bytes={offset}-"} if offset else {}
        resp = self._call("get_object", Bucket=self.bucket, Key=key, **extra)
        body = resp["Body"]
        resumed = offset and resp.get("ContentRange", "").startswith(f"bytes {offset}-")
        start = offset if resumed else 0
        try:
            yield Stream(start, self._chunks(body, file.path))
        finally:
            body.close()

    def verify(self, version: int, file: RemoteFile, path: Path) -> None:
        """A multi-part upload's ETag: the MD5 of its parts' MD5s, "-" the part count,
        with the part size read from the store (part 1's length)."""
        etag = self._multipart.get((version, file.path))
        if etag is None:
            return
        parts = int(etag.rpartition("-")[2])
        head = self._call("head_object", Bucket=self.bucket, Key=self._key(version, file.path),
                          PartNumber=1)
        part_size = int(head["ContentLength"])
        digests = b""
        with open(path, "rb") as f:
            while True:
                md5 = hashlib.md5(usedforsecurity=False)
                left = part_size
                while left and (data := f.read(min(CHUNK, left))):
                    md5.update(data)
                    left -= len(data)
                if left == part_size:
                    break
                digests += md5.digest()
        got = f"{hashlib.md5(digests, usedforsecurity=False).hexdigest()}-{len(digests) // 16}"
        if len(digests) // 16 != parts or got != etag:
            raise DigestMismatch(f"{self.display_url}: {file.path}: its bytes do not match the "
                                 f"multi-part ETag {etag} (got {got})")

    def push(self, src: Path, version: int) -> list[str]:
        """Upload the files under ``src`` as ``version`` (with their SHA-256 checksums
        stored); the keys written."""
        keys = []
        for path in sorted(p for p in src.rglob("*") if p.is_file()):
            key = self._key(version, path.relative_to(src).as_posix())
            with open(path, "rb") as f:
                self._call("put_object", Bucket=self.bucket, Key=key, Body=f,
                           ChecksumAlgorithm="SHA256")
            keys.append(key)
        return keys

    # -- the client ---------------------------------------------------------------------

    def _key(self, version: int, rel: str) -> str:
        return f"{self.prefix}/{version}/{rel}" if self.prefix else f"{version}/{rel}"

    def _chunks(self, body: Any, name: str) -> Iterator[bytes]:
        from botocore.exceptions import BotoCoreError

        try:
            yield from body.iter_chunks(CHUNK)
        except BotoCoreError as exc:
            raise SourceUnavailable(f"{self.display_url}: {name}: transfer cut "
                                    f"({type(exc).__name__}); kept for a resume") from None

    def _pages(self, **kw: Any) -> Iterator[dict]:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            paginator = self._s3().get_paginator("list_objects_v2")
            yield from paginator.paginate(Bucket=self.bucket, **kw)
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc) from None

    def _call(self, method: str, **kw: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self._s3(), method)(**kw)
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc) from None

    def _error(self, exc: Exception) -> SourceError:
        """A boto error said by its code only (its text may name the signed request)."""
        from botocore.exceptions import ClientError, NoCredentialsError

        if isinstance(exc, NoCredentialsError):
            return SourceDenied(f"{self.display_url}: no AWS credentials found (AWS_* "
                                "environment or ~/.aws, as boto3 reads them)")
        if isinstance(exc, ClientError):
            code = str(exc.response.get("Error", {}).get("Code", "?"))[:60]
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
            return http_error(self.display_url, status, by="the store", detail=f" {code}")
        return SourceUnavailable(f"{self.display_url}: unreachable ({type(exc).__name__})")

    def _s3(self) -> Any:
        with self._lock:
            if self._client is None:
                import boto3
                from botocore.config import Config

                c = self._config
                session = boto3.session.Session()
                creds = session.get_credentials()  # as boto3 finds them; None: unsigned fails
                if creds is not None:  # kept out of botocore's DEBUG request logs
                    frozen = creds.get_frozen_credentials()
                    redact_loggers((frozen.secret_key, frozen.token))
                self._client = session.client(
                    "s3", endpoint_url=c["endpoint_url"], region_name=c["region"],
                    verify=c["ca_file"] if c["ca_file"] else True,
                    config=Config(connect_timeout=c["timeout_s"], read_timeout=c["timeout_s"],
                                  retries={"max_attempts": 2, "mode": "standard"},
                                  s3={"addressing_style": "path"} if c["endpoint_url"] else None))
            return self._client
