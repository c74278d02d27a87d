"""Pulling models: ``sources`` times a cold pull (list, download, verify, rename) of
real ONNX models of 1-200 MB from each kind of source on loopback: ``file://``, a
Range-capable ``http://`` server, moto's S3 server and Debian's ``docker-registry``,
with MB/s. Each pull goes to a fresh directory (nothing resumed); the median of
``--reps`` pulls. Sections are subcommands, so later parts of issue 26 add theirs.

    .venv/bin/python bench/pull.py sources [--sizes 1,10,50,200] [--reps 3]
        [--schemes file,http,s3,oci]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import logging
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.modelzoo import write_mlp  # noqa: E402
from agent.sources import open_source  # noqa: E402
from tests.servers import oci_registry, range_http_server, s3_server  # noqa: E402

SCHEMES = ("file", "http", "s3", "oci")


def make_model(root: Path, megabytes: int) -> Path:
    """``root/1/model.onnx``: an MLP of about ``megabytes`` MB (one hidden x hidden
    matrix of float32)."""
    hidden = int(math.sqrt(megabytes * 1e6 / 4))
    return write_mlp(root / "1" / "model.onnx", inputs=64, hidden=hidden, layers=2,
                     outputs=8, seed=megabytes)


@contextlib.contextmanager
def publish(scheme: str, root: Path, work: Path) -> Iterator[tuple[str, dict]]:
    """(url, options) of ``root`` (holding ``1/model.onnx``) published in ``scheme``."""
    model = root / "1" / "model.onnx"
    if scheme == "file":
        yield root.as_uri(), {}
    elif scheme == "http":
        digest = hashlib.sha256(model.read_bytes()).hexdigest()
        with range_http_server(model.parent) as server:
            yield f"{server.url}/model.onnx#sha256={digest}", {}
    elif scheme == "s3":
        with s3_server(work / "aws") as s3:
            os.environ.update(s3.env)
            s3.client().create_bucket(Bucket="bench")
            opts = {"endpoint_url": s3.endpoint_url}
            open_source("s3://bench/model", opts).push(root / "1", 1)
            yield "s3://bench/model", opts
    else:
        with oci_registry(work / "registry") as reg:
            url = f"oci://{reg.host}/bench/model"
            open_source(url).push(root / "1", "1")
            yield url, {}


def time_pulls(url: str, opts: dict, work: Path, reps: int,
               clock: Callable[[], float] = time.perf_counter) -> list[float]:
    out = []
    for i in range(reps):
        dest = work / f"pull-{i}" / "1"
        src = open_source(url, opts)
        t = clock()
        src.pull(1, dest)
        out.append(clock() - t)
    return out


def sources(args: argparse.Namespace) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    schemes = [s for s in args.schemes.split(",") if s]
    print(f"load average {open('/proc/loadavg').read().split()[:3]}")
    print(f"{'scheme':6} {'MB':>6} {'pull s':>8} {'MB/s':>8}   (median of {args.reps})")
    for size in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp) / "src"
            megabytes = make_model(root, size).stat().st_size / 1e6
            for scheme in schemes:
                work = Path(tmp) / scheme
                try:
                    with publish(scheme, root, work) as (url, opts):
                        took = statistics.median(time_pulls(url, opts, work, args.reps))
                except BaseException as exc:  # noqa: BLE001 - pytest.skip's "no server here"
                    if type(exc).__name__ != "Skipped":
                        raise
                    print(f"{scheme:6} {megabytes:6.1f}  skipped: {exc}")
                    continue
                print(f"{scheme:6} {megabytes:6.1f} {took:8.3f} {megabytes / took:8.1f}",
                      flush=True)
    print(f"load average {open('/proc/loadavg').read().split()[:3]}")


def main() -> None:
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's request log
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="section", required=True)
    p = sub.add_parser("sources", help="cold pull time per source and model size")
    p.add_argument("--sizes", default="1,10,50,200", help="model sizes in MB")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--schemes", default=",".join(SCHEMES))
    p.set_defaults(run=sources)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
