"""Model sources (agent/sources): each scheme lists its versions and pulls a real ONNX
model made here that then loads in onnxruntime, from real servers on loopback
(tests/servers.py); and the faults: a cut transfer resumes with Range, a wrong digest
leaves nothing, a full disk says so, a stop stops, the bandwidth cap holds, hostile
archives are refused, and no credential reaches a message or a log record."""

from __future__ import annotations

import hashlib
import io
import logging
import os
import shutil
import ssl
import stat
import subprocess
import tarfile
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from agent.modelzoo import write_mlp
from agent.sources import (DigestMismatch, DiskFull, PullStopped, SourceError, SourceNotFound,
                           SourceUnavailable, open_source, partial_dir)
from agent.sources.bandwidth import TokenBucket
from tests.helpers import TINY_MLP, Clock, issue_cert, make_ca, wait_for
from tests.servers import range_http_server

BIG_MLP = dict(TINY_MLP, hidden=256, layers=4)  # ~800 KB: several chunks


def loads(version_dir: Path) -> np.ndarray:
    """Run the pulled model once in onnxruntime: it loads and answers."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(version_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    return sess.run(None, {name: np.ones((1, TINY_MLP["inputs"]), np.float32)})[0]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def model_file(tmp_path) -> Path:
    return write_mlp(tmp_path / "src" / "model.onnx", **BIG_MLP)


# -- file:// --------------------------------------------------------------------------


def test_file_source_lists_and_pulls_verified_versions(tmp_path):
    root = tmp_path / "nfs" / "resnet"
    for v in (1, 2, 10):
        write_mlp(root / str(v) / "model.onnx", **dict(TINY_MLP, seed=v))
    (root / "notes").mkdir()
    (root / "2" / "SHA256SUMS").write_text(f"{sha256(root / '2' / 'model.onnx')}  model.onnx\n")
    src = open_source(root.as_uri())
    assert src.versions() == [1, 2, 10]
    (f,) = src.files(2)
    assert (f.path, f.size, f.digest) == ("model.onnx", (root / "2" / "model.onnx").stat().st_size,
                                          f"sha256:{sha256(root / '2' / 'model.onnx')}")
    seen = []
    result = src.pull(2, tmp_path / "local" / "resnet" / "2", progress=seen.append)
    dest = tmp_path / "local" / "resnet" / "2"
    assert sorted(p.name for p in dest.iterdir()) == ["model.onnx"]
    assert (dest / "model.onnx").read_bytes() == (root / "2" / "model.onnx").read_bytes()
    assert result.version == 2 and result.bytes == f.size and seen[-1] == f.size
    assert result.digest.startswith("sha256:")
    loads(dest)
    assert not partial_dir(dest).exists()
    with pytest.raises(SourceNotFound, match="no version 3"):
        src.pull(3, tmp_path / "local" / "resnet" / "3")
    with pytest.raises(SourceError, match="exists already"):
        src.pull(2, dest)


def test_file_source_refuses_a_wrong_manifest_digest(tmp_path):
    root = tmp_path / "nfs"
    write_mlp(root / "1" / "model.onnx", **TINY_MLP)
    (root / "1" / "SHA256SUMS").write_text(f"{'0' * 64}  model.onnx\n")
    dest = tmp_path / "local" / "1"
    with pytest.raises(DigestMismatch, match="do not match sha256:0000"):
        open_source(root.as_uri()).pull(1, dest)
    assert not dest.exists() and not partial_dir(dest).exists()


@pytest.mark.parametrize("url, options, message", [
    ("ftp://host/x", None, "unknown scheme 'ftp'"),
    ("file://relative/path", None, "file:///absolute/path"),
    ("https://host/model.onnx", None, "source_options.sha256"),
    ("https://host/model.onnx#sha256=abc", None, "bad digest"),
    ("http://example.com/model.onnx", None, "source_options.insecure"),
    ("http://127.0.0.1/model.onnx", {"version": 0}, "source_options.version"),
    ("http://127.0.0.1/model.onnx", {"version": "2"}, "source_options.version"),
    ("http://127.0.0.1/model.onnx", {"bogus": 1}, "unknown option(s) bogus"),
    ("https://user:hunter2@host/model.onnx", None, "credentials in the URL"),
    ("", None, "expected a URL"),
])
def test_bad_urls_and_options_are_400_naming_the_problem(url, options, message):
    with pytest.raises(SourceError) as err:
        open_source(url, options)
    assert err.value.status == 400 and isinstance(err.value, ValueError)
    assert message in str(err.value)
    assert "hunter2" not in str(err.value)


# -- http(s):// -------------------------------------------------------------------------


def test_http_pull_of_a_file_and_https_with_a_ca(tmp_path, model_file):

    digest = sha256(model_file)
    with range_http_server(model_file.parent) as server:
        src = open_source(f"{server.url}/model.onnx?X-Amz-Signature=s3cr3t#sha256={digest}",
                          {"version": 4})
        assert src.display_url == f"{server.url}/model.onnx"
        assert src.versions() == [4]
        (f,) = src.files(4)
        assert (f.path, f.size, f.digest) == ("model.onnx", model_file.stat().st_size,
                                              f"sha256:{digest}")
        result = src.pull(4, tmp_path / "m" / "4")
        assert result.digest == f"sha256:{digest}" and result.bytes == f.size
        loads(tmp_path / "m" / "4")
        with pytest.raises(SourceNotFound):
            open_source(f"{server.url}/nope.onnx").files(1)

    (tmp_path / "ca").mkdir()
    ca = make_ca(tmp_path / "ca")
    cert = issue_cert(ca, tmp_path / "ca", "server")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert.cert_file, cert.key_file)
    with range_http_server(model_file.parent, ssl_context=ctx) as server:
        url = f"{server.url}/model.onnx#sha256={digest}"
        with pytest.raises(SourceError, match="TLS verification failed.*ca_file"):
            open_source(url).files(1)
        open_source(url, {"ca_file": str(ca.cert_file)}).pull(1, tmp_path / "tls" / "1")
        loads(tmp_path / "tls" / "1")


def test_a_cut_transfer_resumes_with_range(tmp_path, model_file):
    size = model_file.stat().st_size
    with range_http_server(model_file.parent) as server:
        src = open_source(f"{server.url}/model.onnx#sha256={sha256(model_file)}")
        dest = tmp_path / "m" / "1"
        server.cut_after = size // 3
        with pytest.raises(SourceUnavailable, match="cut after"):
            src.pull(1, dest)
        assert not dest.exists()
        kept = partial_dir(dest) / "files" / "model.onnx"
        assert 0 < kept.stat().st_size < size
        with pytest.raises(Exception):  # the partial file is not a loadable model
            loads(kept.parent)
        server.cut_after = None
        server.served.clear()
        result = src.pull(1, dest)
        # (the server counts a transfer once it has written it: the client may be first)
        (resumed,) = wait_for(lambda: [s for s in server.served if s.range != "bytes=0-0"],
                              5, "the resumed transfer counted")  # not the listing
        assert resumed.range == f"bytes={size // 3}-"
        assert resumed.sent == size - size // 3 == result.bytes
        loads(dest)
        assert not partial_dir(dest).exists()


def test_a_stopped_server_is_unavailable_then_resumed(tmp_path, model_file):
    with range_http_server(model_file.parent) as server:
        src = open_source(f"{server.url}/model.onnx#sha256={sha256(model_file)}")
        server.stop()
        with pytest.raises(SourceUnavailable, match="unreachable"):
            src.pull(1, tmp_path / "m" / "1")
        server.start()
        src.pull(1, tmp_path / "m" / "1")
        loads(tmp_path / "m" / "1")


def test_a_server_without_range_restarts_from_zero(tmp_path, model_file):
    size = model_file.stat().st_size
    with range_http_server(model_file.parent) as server:
        src = open_source(f"{server.url}/model.onnx#sha256={sha256(model_file)}")
        server.cut_after = size // 2
        with pytest.raises(SourceUnavailable):
            src.pull(1, tmp_path / "m" / "1")
        server.cut_after, server.ignore_range = None, True
        assert src.pull(1, tmp_path / "m" / "1").bytes == size
        loads(tmp_path / "m" / "1")


def test_corrupt_bytes_are_refused_and_nothing_is_kept(tmp_path, model_file):
    with range_http_server(model_file.parent) as server:
        server.corrupt = True
        dest = tmp_path / "m" / "1"
        with pytest.raises(DigestMismatch) as err:
            open_source(f"{server.url}/model.onnx#sha256={sha256(model_file)}").pull(1, dest)
        assert err.value.status == 502
        assert not dest.exists() and not partial_dir(dest).exists()
        server.corrupt = False
        with pytest.raises(DigestMismatch):
            open_source(f"{server.url}/model.onnx#sha256={'1' * 64}").pull(1, dest)
        assert not dest.exists() and not partial_dir(dest).exists()


def test_a_stop_event_stops_and_the_partial_resumes(tmp_path):
    stop = threading.Event()
    model_file = write_mlp(tmp_path / "src" / "1" / "model.onnx",
                           **dict(TINY_MLP, hidden=512, layers=3))  # several chunks
    src = open_source((tmp_path / "src").as_uri())
    dest = tmp_path / "m" / "1"

    def progress(done: int) -> None:
        if done > 0:
            stop.set()

    with pytest.raises(PullStopped):
        src.pull(1, dest, progress=progress, stop=stop)
    assert partial_dir(dest).exists() and not dest.exists()
    assert src.pull(1, dest).bytes < model_file.stat().st_size
    loads(dest)


def test_the_bandwidth_cap_holds_on_a_fake_clock():
    clock = Clock(0.0)
    slept = []

    def sleep(s: float) -> None:
        slept.append(s)
        clock.t += s

    bucket = TokenBucket(1000, clock=clock, sleep=sleep)
    for _ in range(50):
        bucket.take(100)
    # 5000 bytes at 1000 B/s with a 100-byte burst: 4.9 s on the clock
    assert clock.t == pytest.approx(4.9)
    clock.t += 100  # idle: the bucket refills to its burst only
    before = clock.t
    bucket.take(1000)
    assert clock.t - before == pytest.approx(0.9)


def test_a_pull_under_a_bandwidth_cap_takes_its_time(tmp_path, model_file):
    clock = Clock()
    waits = []

    def sleep(s: float) -> None:
        waits.append(s)
        clock.t += s

    root = model_file.parent.parent
    (root / "1").mkdir()
    shutil.copy(model_file, root / "1" / "model.onnx")
    size = model_file.stat().st_size
    src = open_source(root.as_uri(), clock=clock, sleep=sleep)
    result = src.pull(1, tmp_path / "m" / "1", bandwidth_bps=size // 4)
    assert result.seconds == pytest.approx(4, rel=0.05)
    loads(tmp_path / "m" / "1")


def test_a_bandwidth_cap_holds_in_real_time_over_http(tmp_path, model_file):
    size = model_file.stat().st_size
    rate = size * 3  # a third of a second, at the least
    with range_http_server(model_file.parent) as server:
        src = open_source(f"{server.url}/model.onnx#sha256={sha256(model_file)}")
        t = time.monotonic()
        result = src.pull(1, tmp_path / "m" / "1", bandwidth_bps=rate)
        took = time.monotonic() - t
    assert took >= (size - rate // 10) / rate  # the bucket's burst is a tenth of a second
    assert result.seconds >= (size - rate // 10) / rate
    loads(tmp_path / "m" / "1")


def test_a_full_disk_fails_clearly_and_keeps_nothing(tmp_path, model_file):
    root = model_file.parent.parent
    (root / "1").mkdir()
    shutil.copy(model_file, root / "1" / "model.onnx")
    size = model_file.stat().st_size
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size // 2}", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (not root): the injected free-space test "
                    "below covers the check")
    try:
        dest = mnt / "m" / "1"
        with pytest.raises(DiskFull, match=rf"disk full pulling .*: needed {size} bytes, \d+ free"):
            open_source(root.as_uri()).pull(1, dest)
        assert not dest.exists() and not partial_dir(dest).exists()
        # a file system that fills up during the pull (free room misreported): ENOSPC
        with pytest.raises(DiskFull, match="disk full pulling") as err:
            open_source(root.as_uri(), disk_free=lambda p: 1 << 40).pull(1, dest)
        assert err.value.status == 507
        assert not dest.exists() and not partial_dir(dest).exists()
        assert list((mnt / "m").iterdir()) == []
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_injected_free_space_below_the_model_is_disk_full(tmp_path, model_file):
    root = model_file.parent.parent
    (root / "1").mkdir()
    shutil.copy(model_file, root / "1" / "model.onnx")
    dest = tmp_path / "m" / "1"
    with pytest.raises(DiskFull, match="free"):
        open_source(root.as_uri(), disk_free=lambda p: 1000).pull(1, dest)
    assert not dest.exists() and not partial_dir(dest).exists()


# -- archives ---------------------------------------------------------------------------


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for info, data in members:
            info.size = len(data) if data is not None else 0
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def test_archives_unpack_as_the_version(tmp_path, model_file):
    www = tmp_path / "www"
    www.mkdir()
    data = model_file.read_bytes()
    _tar(www / "resnet-3.tar.gz", [(tarfile.TarInfo("model.onnx"), data),
                                   (tarfile.TarInfo("extra/labels.txt"), b"cat\ndog\n")])
    with zipfile.ZipFile(www / "resnet-3.zip", "w") as zf:
        zf.writestr("model.onnx", data)
    with range_http_server(www) as server:
        for name in ("resnet-3.tar.gz", "resnet-3.zip"):
            src = open_source(f"{server.url}/{name}#sha256={sha256(www / name)}",
                              {"version": 3})
            dest = tmp_path / name / "3"
            src.pull(3, dest)
            loads(dest)
            assert not partial_dir(dest).exists()
        labels = tmp_path / "resnet-3.tar.gz" / "3" / "extra" / "labels.txt"
        assert labels.read_text() == "cat\ndog\n"


def _hostile_tars(www: Path) -> dict[str, str]:
    link = tarfile.TarInfo("model.onnx")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    hard = tarfile.TarInfo("model.onnx")
    hard.type, hard.linkname = tarfile.LNKTYPE, "../../x"
    dev = tarfile.TarInfo("dev")
    dev.type = tarfile.CHRTYPE
    cases = {"abs.tar.gz": ([(tarfile.TarInfo("/tmp/evil"), b"x")], "absolute or '..'"),
             "dotdot.tar.gz": ([(tarfile.TarInfo("../evil"), b"x")], "absolute or '..'"),
             "deep.tar.gz": ([(tarfile.TarInfo("a/../../evil"), b"x")], "absolute or '..'"),
             "sym.tar.gz": ([(link, None)], "a link"),
             "hard.tar.gz": ([(hard, None)], "a link"),
             "dev.tar.gz": ([(dev, None)], "not a regular file"),
             "big.tar.gz": ([(tarfile.TarInfo("model.onnx"), b"\0" * 200_000)], "over the cap")}
    for name, (members, _) in cases.items():
        _tar(www / name, members)
    with zipfile.ZipFile(www / "zipslip.zip", "w") as zf:
        zf.writestr("../../evil", b"x")
    with zipfile.ZipFile(www / "ziplink.zip", "w") as zf:
        info = zipfile.ZipInfo("model.onnx")
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(info, "/etc/passwd")
    return {**{n: why for n, (_, why) in cases.items()}, "zipslip.zip": "absolute or '..'",
            "ziplink.zip": "a link"}


def test_hostile_archive_entries_are_refused(tmp_path):
    www = tmp_path / "www"
    www.mkdir()
    cases = _hostile_tars(www)
    with range_http_server(www) as server:
        for name, why in cases.items():
            dest = tmp_path / "out" / name / "1"
            src = open_source(f"{server.url}/{name}#sha256={sha256(www / name)}",
                              {"max_unpacked_bytes": "100KB"})
            with pytest.raises(DigestMismatch, match=why):
                src.pull(1, dest)
            assert not dest.exists() and not partial_dir(dest).exists(), name
    assert not (tmp_path / "evil").exists() and not Path("/tmp/evil").exists()


# -- credentials ------------------------------------------------------------------------


def test_signed_urls_never_reach_a_message_or_a_log(tmp_path, model_file, caplog):
    secret = "Signature=SENTINEL-9c1f"
    caplog.set_level(logging.DEBUG)
    with range_http_server(model_file.parent) as server:
        src = open_source(f"{server.url}/model.onnx?{secret}#sha256={sha256(model_file)}")
        messages = [repr(src), src.display_url]
        server.corrupt = True
        for call in (lambda: src.pull(1, tmp_path / "a"),
                     lambda: open_source(f"{server.url}/gone.onnx?{secret}").files(1)):
            with pytest.raises(SourceError) as err:
                call()
            messages.append(str(err.value))
        server.stop()
        with pytest.raises(SourceUnavailable) as err:
            src.pull(1, tmp_path / "b")
        messages.append(str(err.value))
    text = "\n".join(messages + [r.getMessage() for r in caplog.records])
    assert "SENTINEL" not in text, text


# -- s3:// ------------------------------------------------------------------------------


@pytest.fixture
def s3(tmp_path, monkeypatch):
    from tests.servers import s3_server

    with s3_server(tmp_path / "aws") as server:
        for k, v in server.env.items():
            monkeypatch.setenv(k, v)
        yield server


def test_s3_lists_versions_and_pulls_checked_by_checksum_or_etag(s3, tmp_path):
    client = s3.client()
    client.create_bucket(Bucket="models")
    for v in (1, 2, 7):
        path = write_mlp(tmp_path / "v" / str(v) / "model.onnx", **dict(TINY_MLP, seed=v))
        checksum = {"ChecksumAlgorithm": "SHA256"} if v == 2 else {}
        client.put_object(Bucket="models", Key=f"zoo/resnet/{v}/model.onnx",
                          Body=path.read_bytes(), **checksum)
    client.put_object(Bucket="models", Key="zoo/resnet/README", Body=b"not a version")
    opts = {"endpoint_url": s3.endpoint_url}
    src = open_source("s3://models/zoo/resnet", opts)
    assert src.display_url == "s3://models/zoo/resnet"
    assert src.versions() == [1, 2, 7]
    (f2,) = src.files(2)
    assert f2.digest == f"sha256:{sha256(tmp_path / 'v' / '2' / 'model.onnx')}"
    (f7,) = src.files(7)
    v7 = (tmp_path / "v" / "7" / "model.onnx").read_bytes()
    assert f7.digest == "md5:" + hashlib.md5(v7).hexdigest()
    for v in (2, 7):
        result = src.pull(v, tmp_path / "local" / str(v))
        assert (tmp_path / "local" / str(v) / "model.onnx").read_bytes() == \
            (tmp_path / "v" / str(v) / "model.onnx").read_bytes()
        assert result.bytes == (tmp_path / "v" / str(v) / "model.onnx").stat().st_size
        loads(tmp_path / "local" / str(v))
    with pytest.raises(SourceNotFound, match="no version 3"):
        src.pull(3, tmp_path / "local" / "3")
    with pytest.raises(SourceNotFound):
        open_source("s3://no-such-bucket/x", opts).versions()
    with pytest.raises(SourceUnavailable, match="unreachable"):
        open_source("s3://models/zoo/resnet", {"endpoint_url": "http://127.0.0.1:1",
                                               "timeout_s": 2}).versions()


def test_s3_multipart_uploads_are_checked_by_their_etag(s3, tmp_path):
    from boto3.s3.transfer import TransferConfig

    client = s3.client()
    client.create_bucket(Bucket="big")
    path = write_mlp(tmp_path / "v" / "model.onnx", **dict(TINY_MLP, hidden=512, layers=8))
    assert path.stat().st_size > 5 << 20
    client.upload_file(str(path), "big", "m/1/model.onnx",
                       Config=TransferConfig(multipart_threshold=5 << 20,
                                             multipart_chunksize=5 << 20))
    src = open_source("s3://big/m", {"endpoint_url": s3.endpoint_url})
    (f,) = src.files(1)
    assert f.digest is None  # verified by the recomputed multi-part ETag instead
    src.pull(1, tmp_path / "ok" / "1")
    loads(tmp_path / "ok" / "1")
    # the same listing, other bytes on disk: the ETag check refuses them
    src.files(1)
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\1" + path.read_bytes()[1:])
    with pytest.raises(DigestMismatch, match="multi-part ETag"):
        src.verify(1, f, bad)


def test_s3_without_credentials_or_boto3_says_what_to_do(s3, tmp_path, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(SourceError, match="no AWS credentials") as err:
        open_source("s3://models/x", {"endpoint_url": s3.endpoint_url}).versions()
    assert err.value.status == 403
    from tests.helpers import without_packages

    env = without_packages(tmp_path / "site", ("boto3", "botocore"))
    out = subprocess.run([os.sys.executable, "-c",
                          "from agent.sources import open_source, SourceError\n"
                          "try:\n    open_source('s3://b/p')\n"
                          "except SourceError as e:\n    print(e)"],
                         capture_output=True, text=True, env=env, timeout=60)
    # this interpreter (relative to the current directory), the extra's requirement
    python, _, named = out.stdout.strip().partition(": ")[2].partition(" -m pip install ")
    assert Path(python).absolute() == Path(os.sys.executable).absolute(), out.stdout
    assert named.startswith("'boto3>="), out.stdout


def test_s3_credentials_never_reach_a_message_or_a_log(s3, tmp_path, caplog, monkeypatch):
    token = "SESSION-TOKEN-SENTINEL-31"  # botocore logs it with each request at DEBUG
    monkeypatch.setenv("AWS_SESSION_TOKEN", token)
    caplog.set_level(logging.DEBUG)
    client = s3.client()
    client.create_bucket(Bucket="sentinel")
    path = write_mlp(tmp_path / "v" / "model.onnx", **TINY_MLP)
    client.put_object(Bucket="sentinel", Key="m/1/model.onnx", Body=path.read_bytes())
    src = open_source("s3://sentinel/m", {"endpoint_url": s3.endpoint_url})
    src.pull(1, tmp_path / "a")
    messages = [repr(src)]
    for call in (lambda: src.pull(2, tmp_path / "b"),
                 lambda: open_source("s3://nope/m", {"endpoint_url": s3.endpoint_url}).versions()):
        with pytest.raises(SourceError) as err:
            call()
        messages.append(str(err.value))
    secret = s3.env["AWS_SECRET_ACCESS_KEY"]
    text = "\n".join(messages + [r.getMessage() for r in caplog.records])
    assert any(r.name == "botocore.endpoint" for r in caplog.records)  # requests were logged
    assert secret not in text and token not in text


# -- oci:// -----------------------------------------------------------------------------


@pytest.fixture
def registry(tmp_path):
    from tests.servers import oci_registry

    with oci_registry(tmp_path / "registry") as reg:
        yield reg


def _blob_file(reg, digest: str) -> Path:
    hexpart = digest.split(":")[1]
    return reg.storage / "docker/registry/v2/blobs/sha256" / hexpart[:2] / hexpart / "data"


def test_oci_lists_numeric_tags_and_pulls_verified_blobs(registry, tmp_path):
    for v in (1, 2):
        d = tmp_path / "push" / str(v)
        write_mlp(d / "model.onnx", **dict(BIG_MLP, seed=v))
        (d / "extra").mkdir()
        (d / "extra" / "labels.txt").write_text("a\nb\n")
        open_source(f"oci://{registry.host}/models/resnet").push(d, str(v))
    open_source(f"oci://{registry.host}/models/resnet:latest").push(tmp_path / "push" / "2")
    src = open_source(f"oci://{registry.host}/models/resnet")
    assert src.versions() == [1, 2]
    files = src.files(2)
    assert [f.path for f in files] == ["extra/labels.txt", "model.onnx"]
    assert all(f.digest.startswith("sha256:") for f in files)
    result = src.pull(2, tmp_path / "local" / "2")
    assert (tmp_path / "local" / "2" / "model.onnx").read_bytes() == \
        (tmp_path / "push" / "2" / "model.onnx").read_bytes()
    assert (tmp_path / "local" / "2" / "extra" / "labels.txt").read_text() == "a\nb\n"
    loads(tmp_path / "local" / "2")
    # one tag, or the manifest's digest, as the one version given
    pinned = open_source(f"oci://{registry.host}/models/resnet@{result.digest}", {"version": 5})
    assert pinned.versions() == [5]
    assert pinned.pull(5, tmp_path / "pinned" / "5").digest == result.digest
    assert open_source(f"oci://{registry.host}/models/resnet:latest").versions() == [1]
    with pytest.raises(SourceNotFound, match="no version 9"):
        src.pull(9, tmp_path / "local" / "9")
    with pytest.raises(SourceNotFound):
        open_source(f"oci://{registry.host}/models/nothing").versions()


def test_oci_a_hostile_file_title_is_refused(registry, tmp_path):
    import json

    from agent.sources.ocisource import MANIFEST_TYPES, TITLE

    src = open_source(f"oci://{registry.host}/models/hostile")
    d = tmp_path / "push"
    write_mlp(d / "model.onnx", **TINY_MLP)
    src.push(d, "1")
    manifest = json.loads(src.client.request(
        "GET", src.client.url("manifests/1"), headers={"Accept": MANIFEST_TYPES[0]}).read())
    manifest["layers"][0]["annotations"][TITLE] = "../../escaped.onnx"
    src.client.request("PUT", src.client.url("manifests/2"), data=json.dumps(manifest).encode(),
                       headers={"Content-Type": MANIFEST_TYPES[0]}, ok=(201,)).close()
    dest = tmp_path / "deep" / "local" / "2"
    with pytest.raises(SourceError, match="unsafe file path"):
        src.pull(2, dest)
    assert not dest.exists() and not (tmp_path / "deep" / "escaped.onnx").exists()
    manifest["layers"][0]["annotations"][TITLE] = "model.onnx"
    manifest["layers"].append(manifest["layers"][0])  # the same file twice
    src.client.request("PUT", src.client.url("manifests/3"), data=json.dumps(manifest).encode(),
                       headers={"Content-Type": MANIFEST_TYPES[0]}, ok=(201,)).close()
    with pytest.raises(SourceError, match="'model.onnx' twice"):
        src.pull(3, tmp_path / "local" / "3")


def test_oci_a_corrupted_blob_is_refused(registry, tmp_path):
    d = tmp_path / "push"
    write_mlp(d / "model.onnx", **TINY_MLP)
    src = open_source(f"oci://{registry.host}/models/bad")
    src.push(d, "1")
    (f,) = src.files(1)
    blob = _blob_file(registry, f.digest)
    data = bytearray(blob.read_bytes())
    data[100] ^= 0xFF
    blob.write_bytes(bytes(data))
    dest = tmp_path / "local" / "1"
    with pytest.raises(DigestMismatch, match=f.digest):
        src.pull(1, dest)
    assert not dest.exists() and not partial_dir(dest).exists()


def test_oci_a_stopped_pull_resumes_with_range_and_a_stopped_registry_is_unavailable(
        registry, tmp_path):
    d = tmp_path / "push"
    model = write_mlp(d / "model.onnx", **dict(TINY_MLP, hidden=512, layers=3))
    src = open_source(f"oci://{registry.host}/models/big")
    src.push(d, "1")
    stop = threading.Event()
    dest = tmp_path / "local" / "1"
    with pytest.raises(PullStopped):
        src.pull(1, dest, stop=stop, progress=lambda done: done and stop.set())
    kept = (partial_dir(dest) / "files" / "model.onnx").stat().st_size
    assert 0 < kept < model.stat().st_size
    registry.proc.terminate()
    registry.proc.wait(10)
    with pytest.raises(SourceUnavailable, match="unreachable"):
        src.pull(1, dest)
    assert partial_dir(dest).exists()
    registry.restart()
    result = src.pull(1, dest)
    assert result.bytes == model.stat().st_size - kept  # the rest only: Range honoured
    loads(dest)


def test_oci_basic_auth_from_docker_config_and_no_password_in_messages(tmp_path, caplog):
    crypt = pytest.importorskip("crypt", reason="no crypt module to write the htpasswd")
    from tests.servers import oci_registry

    password = "PASSWORD-SENTINEL-51"
    htpasswd = tmp_path / "htpasswd"
    salt = crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16)  # cheap bcrypt: fast checks
    htpasswd.write_text(f"alice:{crypt.crypt(password, salt)}\n")
    caplog.set_level(logging.DEBUG)
    with oci_registry(tmp_path / "registry", htpasswd=htpasswd) as reg:
        url = f"oci://{reg.host}/models/private"
        messages = []
        with pytest.raises(SourceError, match="username/password or docker login") as err:
            open_source(url).versions()
        messages.append(str(err.value))
        with pytest.raises(SourceError, match="refused the credentials|access denied") as err:
            open_source(url, {"username": "alice", "password": "wrong-" + password}).versions()
        messages.append(str(err.value))
        d = tmp_path / "push"
        write_mlp(d / "model.onnx", **TINY_MLP)
        open_source(url, {"username": "alice", "password": password}).push(d, "3")
        config = tmp_path / "docker" / "config.json"
        config.parent.mkdir()
        import base64
        import json

        config.write_text(json.dumps({"auths": {reg.host: {
            "auth": base64.b64encode(f"alice:{password}".encode()).decode()}}}))
        src = open_source(url, {"docker_config": str(config)})
        assert src.versions() == [3]
        src.pull(3, tmp_path / "local" / "3")
        loads(tmp_path / "local" / "3")
        messages.append(repr(src))
    text = "\n".join(messages + [r.getMessage() for r in caplog.records])
    assert password not in text


# -- edgeagent model push / ls ----------------------------------------------------------


def test_model_push_and_ls_through_the_cli(registry, s3, tmp_path):
    from click.testing import CliRunner

    from agent.cli import main
    from tests.helpers import EDGEAGENT

    d = tmp_path / "repo" / "resnet" / "4"
    write_mlp(d / "model.onnx", **TINY_MLP)
    done = subprocess.run([EDGEAGENT, "model", "push", str(d),
                           f"oci://{registry.host}/models/resnet", "--version", "4"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"oci://{registry.host}/models/resnet:4 (sha256:" in done.stdout
    s3.client().create_bucket(Bucket="cli")
    runner = CliRunner()

    def run(*args: str):  # noqa: ANN202 - click's Result
        return runner.invoke(main, ["model", *args])

    done = run("push", str(d), "s3://cli/resnet", "--version", "4",
               "-o", f"endpoint_url={s3.endpoint_url}")
    assert done.exit_code == 0, done.output
    for url, extra in ((f"oci://{registry.host}/models/resnet", ()),
                       ("s3://cli/resnet", ("-o", f"endpoint_url={s3.endpoint_url}"))):
        done = run("ls", url, *extra)
        assert done.exit_code == 0, done.output
        version, name, size, digest = done.output.split()
        assert (version, name, int(size)) == ("4", "model.onnx", (d / "model.onnx").stat().st_size)
        pulled = tmp_path / "pulled" / url.split(":")[0] / "4"
        open_source(url, dict([e.split("=", 1) for e in extra[1:]])).pull(4, pulled)
        loads(pulled)
    for args, said in ((("push", str(d), "s3://cli/resnet"), "needs --version"),
                       (("push", str(d), "https://example.com/x#sha256=" + "0" * 64),
                        "oci:// or s3:// only"),
                       (("ls", "oci://127.0.0.1:1/nothing"), "unreachable"),
                       (("ls", "s3://cli/resnet", "-o", "bogus=1"), "unknown option(s) bogus")):
        done = run(*args)
        assert done.exit_code == 1 and said in done.output, (args, done.output)


def test_oci_bearer_tokens_from_the_challenge_and_no_token_in_messages(tmp_path, caplog):
    from tests.servers import TokenService, oci_registry

    password = "TOKEN-PASSWORD-SENTINEL-77"
    tokens = TokenService(tmp_path / "tokens", "bob", password)
    caplog.set_level(logging.DEBUG)
    with oci_registry(tmp_path / "registry", tokens=tokens) as reg:
        url = f"oci://{reg.host}/team/model"
        with pytest.raises(SourceError, match="token service refused") as err:
            open_source(url, {"username": "bob", "password": "nope"}).versions()
        messages = [str(err.value)]
        opts = {"username": "bob", "password": password}
        d = tmp_path / "push"
        write_mlp(d / "model.onnx", **TINY_MLP)
        open_source(url, opts).push(d, "1")
        src = open_source(url, opts)
        assert src.versions() == [1]
        src.pull(1, tmp_path / "local" / "1")
        loads(tmp_path / "local" / "1")
        assert tokens.issued and tokens.refused == 1
        with pytest.raises(SourceNotFound) as err:  # with a token in hand
            src.pull(2, tmp_path / "local" / "2")
        messages.append(str(err.value))
    text = "\n".join(messages + [r.getMessage() for r in caplog.records])
    assert password not in text
    assert not any(t in text or t.split(".")[2] in text for t in tokens.issued)


def test_one_source_pulls_several_versions_at_once(registry, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    src = open_source(f"oci://{registry.host}/models/many")
    for v in (1, 2, 3, 4):
        write_mlp(tmp_path / "push" / str(v) / "model.onnx", **dict(BIG_MLP, seed=v))
        src.push(tmp_path / "push" / str(v), str(v))
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda v: src.pull(v, tmp_path / "local" / str(v)),
                                (1, 2, 3, 4)))
    assert [r.version for r in results] == [1, 2, 3, 4]
    assert len({r.digest for r in results}) == 4
    for v in (1, 2, 3, 4):
        assert (tmp_path / "local" / str(v) / "model.onnx").read_bytes() == \
            (tmp_path / "push" / str(v) / "model.onnx").read_bytes()
        loads(tmp_path / "local" / str(v))
