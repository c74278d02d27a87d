"""Hostile sources (issue 39): a registry that names a token realm that reads local
files or speaks another scheme, pages its tags without end, sends a manifest without
end or drips it, redirects a blob to a local file or drips a blob; and archives that
unpack past the disk budget, hold 100,000 entries or name a path as a file and a
directory. Each is refused with an error naming the cause; nothing outside the agent's
own files is read; the disk tier stays within its budget; other models are still
listed, pulled and served.

The hostile registry is a small aiohttp server written here (a real one on loopback,
speaking the distribution API as far as each case needs): no real registry misbehaves
on request. The agent is a real ``edgeagent serve`` process, or a real agent on
loopback in this process where a test reads its disk tier; the archives are served by
``tests.servers.range_http_server``."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import io
import json
import shutil
import ssl
import tarfile
import time
from pathlib import Path

import pytest
import yaml
from aiohttp import web

from agent.config import AgentConfig
from agent.modelzoo import write_mlp
from agent.sources import SourceError, SourceUnavailable, open_source, partial_dir
from agent.sources.ocisource import MAX_TAG_PAGES, OciSource
from tests.helpers import (TINY_MLP, Agent, AgentServer, ThreadedServer, issue_cert, make_ca,
                           request, v2_body)
from tests.servers import range_http_server

SENTINEL = "SENTINEL-local-file-9c1e"
ROW = v2_body([1.0, 2.0, 3.0, 4.0])
TITLE = "org.opencontainers.image.title"


class HostileRegistry:
    """A registry (distribution API v2 paths) whose repository's first path part says
    how it misbehaves; ``model`` is the ONNX file it serves as the artifact's one
    layer; ``seen`` records each request's path and Authorization header."""

    def __init__(self, model: Path, realm: str = "", ssl_context=None) -> None:
        self.blob = model.read_bytes()
        self.digest = "sha256:" + hashlib.sha256(self.blob).hexdigest()
        self.realm = realm
        self.seen: list[tuple[str, str | None]] = []
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.server = ThreadedServer(app, ssl_context=ssl_context)
        self.host = f"127.0.0.1:{self.server.port}"

    def close(self) -> None:
        self.server.close()

    def manifest(self) -> bytes:
        return json.dumps({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.empty.v1+json",
                       "digest": "sha256:" + hashlib.sha256(b"{}").hexdigest(), "size": 2},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                        "digest": self.digest, "size": len(self.blob),
                        "annotations": {TITLE: "model.onnx"}}]}).encode()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append((request.path_qs, request.headers.get("Authorization")))
        parts = request.path.split("/")  # "", "v2", mode, ..., what
        mode = parts[2] if len(parts) > 3 else ""
        what = "/".join(parts[-2:])
        if mode == "realm" and "Authorization" not in request.headers:
            return web.Response(status=401, headers={
                "WWW-Authenticate": f'Bearer realm="{self.realm}",service="reg",'
                                    f'scope="repository:{mode}:pull"'})
        if what == "tags/list":
            return await self.tags(request, mode)
        if parts[-2] == "manifests":
            return await self.manifest_answer(request, mode)
        if parts[-2] == "blobs":
            return await self.blob_answer(request, mode)
        return web.Response(status=404)

    async def tags(self, request: web.Request, mode: str) -> web.StreamResponse:
        if mode == "linkfile":
            return web.json_response({"tags": ["1"]},
                                     headers={"Link": '<file:///etc/passwd>; rel="next"'})
        if mode in ("endless", "drip"):
            if mode == "drip":
                await asyncio.sleep(0.3)
            page = int(request.query.get("last", "0")) + 1
            return web.json_response({"tags": [str(page)]}, headers={
                "Link": f'</v2/{mode}/m/tags/list?n=1&last={page}>; rel="next"'})
        return web.json_response({"tags": ["1"]})

    async def manifest_answer(self, request: web.Request, mode: str) -> web.StreamResponse:
        if mode not in ("endlessmanifest", "dripmanifest"):
            return web.Response(body=self.manifest(), headers={
                "Content-Type": "application/vnd.oci.image.manifest.v1+json"})
        resp = web.StreamResponse(headers={
            "Content-Type": "application/vnd.oci.image.manifest.v1+json"})
        await resp.prepare(request)
        try:
            while True:  # never ends: the client must hang up
                if mode == "dripmanifest":
                    await asyncio.sleep(0.1)
                    await resp.write(b" ")
                else:
                    await resp.write(b" " * 65536)
        except (ConnectionError, asyncio.CancelledError):
            return resp

    async def blob_answer(self, request: web.Request, mode: str) -> web.StreamResponse:
        if mode == "redirect":
            raise web.HTTPTemporaryRedirect("file:///etc/hostname")
        if mode != "slowblob":
            return web.Response(body=self.blob)
        resp = web.StreamResponse(headers={"Content-Length": str(len(self.blob))})
        await resp.prepare(request)
        try:
            for i in range(0, len(self.blob), 16):  # 64 bytes a second
                await resp.write(self.blob[i:i + 16])
                await asyncio.sleep(0.25)
        except (ConnectionError, asyncio.CancelledError):
            pass
        return resp


@pytest.fixture
def model(tmp_path) -> Path:
    return write_mlp(tmp_path / "model" / "model.onnx", **TINY_MLP)


@pytest.fixture
def secret(tmp_path) -> Path:
    """A local file a hostile realm names: its token must never leave the node."""
    path = tmp_path / "secret.json"
    path.write_text(json.dumps({"token": SENTINEL}))
    return path


@pytest.fixture
def registry(model, secret):
    reg = HostileRegistry(model, realm=secret.as_uri() + "#")  # its query: a fragment
    yield reg
    reg.close()


def _sentinel_sent(reg: HostileRegistry) -> bool:
    return any(auth and SENTINEL in auth or SENTINEL in path for path, auth in reg.seen)


# -- in this process: each case refused, naming its cause ------------------------------


def test_a_token_realm_on_a_local_file_or_another_scheme_is_refused(registry, tmp_path):
    src = open_source(f"oci://{registry.host}/realm/m")
    with pytest.raises(SourceError, match="token realm 'file:///.*secret.json' refused"):
        src.versions()
    for realm in ("ftp://127.0.0.1:21/token", "data:application/json,{}",
                  "gopher://127.0.0.1/token"):
        registry.realm = realm
        with pytest.raises(SourceError, match="token realm .* refused: only http"):
            open_source(f"oci://{registry.host}/realm/m").versions()
    assert registry.seen and not _sentinel_sent(registry)


def test_an_https_registry_may_not_send_its_token_realm_or_redirects_over_http(
        model, tmp_path):
    ca = make_ca(tmp_path)
    cert = issue_cert(ca, tmp_path, "registry")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert.cert_file, cert.key_file)
    reg = HostileRegistry(model, realm="http://127.0.0.1:9/token", ssl_context=context)
    try:
        options = {"ca_file": str(ca.cert_file)}
        with pytest.raises(SourceError, match="token realm 'http://127.0.0.1:9/token' "
                                              "refused: only https"):
            open_source(f"oci://{reg.host}/realm/m", options).versions()
        assert open_source(f"oci://{reg.host}/good/m", options).versions() == [1]
    finally:
        reg.close()


def test_urls_a_registry_hands_back_never_read_a_local_file(registry, tmp_path):
    with pytest.raises(SourceError, match="next page of tags at 'file:///etc/passwd' refused"):
        open_source(f"oci://{registry.host}/linkfile/m").versions()
    dest = tmp_path / "out" / "1"
    with pytest.raises(SourceError, match="redirect .* to 'file:///etc/hostname' refused"):
        open_source(f"oci://{registry.host}/redirect/m").pull(1, dest)
    assert not dest.exists()
    assert not any(p.is_file() and p.read_bytes() == Path("/etc/hostname").read_bytes()
                   for p in partial_dir(dest).rglob("*"))


def test_endless_and_dripping_registries_are_cut_naming_why(registry, tmp_path):
    started = time.monotonic()
    with pytest.raises(SourceError, match=f"tag list runs past {MAX_TAG_PAGES} pages"):
        open_source(f"oci://{registry.host}/endless/m").versions()
    assert sum("/endless/" in p for p, _ in registry.seen) == MAX_TAG_PAGES
    with pytest.raises(SourceError, match="manifest is over 4194304 bytes"):
        open_source(f"oci://{registry.host}/endlessmanifest/m").files(1)
    # dripping: a deadline (here 1 s; 60 s by default) for the whole listing or manifest
    with pytest.raises(SourceUnavailable, match="did not (answer|end) in time"):
        OciSource(f"oci://{registry.host}/drip/m", deadline_s=1.0).versions()
    with pytest.raises(SourceUnavailable, match="manifest did not arrive in time"):
        OciSource(f"oci://{registry.host}/dripmanifest/m", deadline_s=1.0).files(1)
    assert time.monotonic() - started < 20


def test_a_dripping_blob_is_cut_as_stalled_and_kept_for_a_resume(registry, tmp_path):
    dest = tmp_path / "out" / "1"
    src = open_source(f"oci://{registry.host}/slowblob/m", {"timeout_s": 1})
    started = time.monotonic()
    with pytest.raises(SourceUnavailable, match=r"model.onnx: transfer stalled \(under "
                                                r"1024 bytes/s for 1 s\); kept"):
        src.pull(1, dest)
    assert time.monotonic() - started < 10
    assert not dest.exists() and partial_dir(dest).is_dir()
    assert open_source(f"oci://{registry.host}/good/m").pull(1, dest).bytes > 0
    assert (dest / "model.onnx").read_bytes() == registry.blob


# -- a real agent process: the hostile registry delays only its own models -------------


def _sourced(repo: Path, name: str, source: str, **options) -> None:
    (repo / name).mkdir(parents=True)
    (repo / name / "config.yaml").write_text(yaml.safe_dump(
        {"source": source, **({"source_options": options} if options else {})}))


def test_hostile_registries_delay_only_their_own_models(registry, model, tmp_path):
    """Four registries whose tag lists drip without end, one whose realm is a local
    file, one whose blob drips: a model from a healthy file:// source is listed and
    served meanwhile; each hostile one answers an error naming its cause."""
    repo, src = tmp_path / "repo", tmp_path / "src"
    (src / "healthy" / "1").mkdir(parents=True)
    shutil.copy(model, src / "healthy" / "1" / "model.onnx")
    _sourced(repo, "healthy", f"file://{src / 'healthy'}")
    for i in range(4):
        _sourced(repo, f"endless{i}", f"oci://{registry.host}/drip/m{i}")
    _sourced(repo, "realm", f"oci://{registry.host}/realm/m")
    _sourced(repo, "slowblob", f"oci://{registry.host}/slowblob/m", timeout_s=1)
    (tmp_path / "agent.yaml").write_text(yaml.safe_dump({"max_concurrent_pulls": 1}))
    agent = Agent(repo, tmp_path / "data", "--config", str(tmp_path / "agent.yaml"))
    try:
        infer = f"{agent.url}/v2/models/%s/infer"
        started = time.monotonic()
        status, body, _ = request(infer % "healthy", "POST", ROW, timeout=30)
        assert status == 200, body
        assert time.monotonic() - started < 10
        for i in range(4):  # still listing, a page every 0.3 s, for up to a minute
            status, body, _ = request(infer % f"endless{i}", "POST", ROW, timeout=30)
            assert status == 503 and "being listed" in body["error"], body
        status, body, _ = request(infer % "realm", "POST", ROW, timeout=30)
        assert status >= 400 and "token realm" in body["error"] and "refused" in body["error"]
        status, body, _ = request(infer % "slowblob", "POST", ROW, timeout=30)
        assert status == 503 and "transfer stalled" in body["error"], body
        status, body, _ = request(infer % "healthy", "POST", ROW, timeout=30)
        assert status == 200, body  # served all along
        assert not _sentinel_sent(registry)
    finally:
        registry.close()  # the dripping listings end with their connections
        agent.stop()


# -- hostile archives against the disk budget ---------------------------------------


def _targz(path: Path, members: list[tuple[str, bytes | None]]) -> Path:
    """A tar.gz of ``(name, bytes)`` files and ``(name, None)`` directories, in order."""
    with tarfile.open(path, "w:gz", compresslevel=1) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tf.addfile(info)
            else:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return path


class _Zeros(io.RawIOBase):
    """``n`` zero bytes, read a MiB at a time (a bomb's body, never held whole)."""

    def __init__(self, n: int) -> None:
        self.left = n

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = min(len(b), self.left, 1 << 20)
        b[:n] = bytes(n)
        self.left -= n
        return n


def _bomb(path: Path, size: int) -> Path:
    with tarfile.open(path, "w:gz", compresslevel=9) as tf:
        info = tarfile.TarInfo("model.onnx")
        info.size = size
        tf.addfile(info, _Zeros(size))
    return path


def _empty_entries(path: Path, n: int) -> Path:
    """A tar.gz of ``n`` empty files: one header made by ``tarfile``, its name and
    checksum set for each (``tarfile`` itself takes seconds for 100,000)."""
    template = tarfile.TarInfo("f0000000").tobuf(tarfile.USTAR_FORMAT)
    with gzip.open(path, "wb", compresslevel=1) as out:
        for i in range(n):
            header = bytearray(template)
            header[0:8], header[148:156] = b"f%07d" % i, b" " * 8
            header[148:156] = b"%06o\0 " % sum(header)
            out.write(header)
        out.write(bytes(1024))  # the end of the archive
    return path


def _http_sourced(repo: Path, name: str, server, path: str) -> None:
    digest = hashlib.sha256((server.root / path).read_bytes()).hexdigest()
    _sourced(repo, name, f"{server.url}/{path}", sha256=digest)


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def test_hostile_archives_are_refused_and_others_served_within_the_disk_budget(model,
                                                                               tmp_path):
    www, repo = tmp_path / "www", tmp_path / "repo"
    www.mkdir()
    budget = 4 << 20
    _bomb(www / "bomb.tar.gz", 64 << 20)  # 64 KiB on the wire, 64 MiB unpacked
    _empty_entries(www / "many.tar.gz", 100_000)
    _targz(www / "clash.tar.gz", [("model.onnx", model.read_bytes()),
                                  ("model.onnx/inner", b"x")])
    _targz(www / "clash2.tar.gz", [("a", b"x"), ("a", None)])
    # a good archive that unpacks to 3 MiB (its model and padding: far more than its
    # download), so its room is reserved once its entries are known
    _targz(www / "good.tar.gz", [("model.onnx", model.read_bytes()),
                                 ("padding.bin", bytes(3 << 20))])
    with range_http_server(www) as server:
        for name in ("bomb", "many", "clash", "clash2", "good"):
            _http_sourced(repo, name, server, f"{name}.tar.gz")
        data = tmp_path / "data"
        agent = AgentServer(AgentConfig(repository=repo, data_dir=data, cpu_budget=200_000_000,
                                        disk_budget=budget, infer_threads=2))
        try:
            def infer(name):
                return agent.request("POST", f"/v2/models/{name}/infer", ROW)

            status, _, body = infer("bomb")
            assert status == 507 and "unpacks to more than" in body["error"] and \
                "disk budget" in body["error"], body
            started = time.monotonic()
            status, _, body = infer("many")
            assert status == 502 and "more than 10000 entries" in body["error"], body
            assert time.monotonic() - started < 15
            for name, entry in (("clash", "model.onnx/inner"), ("clash2", "a")):
                status, _, body = infer(name)
                assert status == 502 and f"archive entry {entry!r}" in body["error"], body
                assert "FileExistsError" not in body["error"]
            assert _tree_bytes(data / "models") <= budget
            status, _, body = infer("good")
            assert status == 200, body
            assert agent.node.disk.pool.used <= budget
            assert _tree_bytes(data / "models") <= budget
            assert not any((data / "models" / n).is_dir() and any(
                p.name.isdigit() for p in (data / "models" / n).iterdir())
                for n in ("bomb", "many", "clash", "clash2"))
        finally:
            agent.close()


def test_an_archive_evicts_idle_versions_for_its_unpacked_room(model, tmp_path):
    """The disk budget holds an idle version; an archive that unpacks to more than is
    free gets its room by evicting it (as any pull), not a refusal."""
    www, repo, src = tmp_path / "www", tmp_path / "repo", tmp_path / "src"
    www.mkdir()
    (src / "old" / "1").mkdir(parents=True)
    (src / "old" / "1" / "model.onnx").write_bytes(model.read_bytes())
    (src / "old" / "1" / "padding.bin").write_bytes(bytes(2 << 20))
    _sourced(repo, "old", f"file://{src / 'old'}")
    _targz(www / "new.tar.gz", [("model.onnx", model.read_bytes()),
                                ("padding.bin", bytes(2 << 20))])
    with range_http_server(www) as server:
        _http_sourced(repo, "new", server, "new.tar.gz")
        budget = 3 << 20
        agent = AgentServer(AgentConfig(repository=repo, data_dir=tmp_path / "data",
                                        cpu_budget=200_000_000, disk_budget=budget,
                                        infer_threads=2))
        try:
            assert agent.request("POST", "/v2/models/old/infer", ROW)[0] == 200
            assert agent.request("POST", "/v1/cache/old/evict")[0] == 200
            status, _, body = agent.request("POST", "/v2/models/new/infer", ROW)
            assert status == 200, body
            held = {m["model"] for m in agent.node.disk.holdings()}
            assert held == {"new"} and agent.node.disk.pool.used <= budget
        finally:
            agent.close()
