"""The default install has no TensorFlow (pyproject's dependencies; ``make run``): the
agent must import, start and serve ONNX models without ever importing it.

The test venv has TensorFlow (the tfserving extra), so the child process gets a
``sitecustomize`` that makes ``tensorflow`` and ``tensorflow_serving`` unimportable and
reports every attempt on stderr.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

from tests.helpers import TINY_MLP, add_mlp

ROOT = Path(__file__).resolve().parent.parent
BLOCKER = '''
import sys, importlib.abc
class _NoTensorFlow(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("tensorflow", "tensorflow_serving"):
            print(f"BLOCKED import {name}", file=sys.stderr, flush=True)
            raise ImportError(f"No module named {name!r} (blocked)", name=name)
        return None
sys.meta_path.insert(0, _NoTensorFlow())
'''


def test_default_dependencies_have_no_tensorflow():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = " ".join(project["dependencies"]).lower()
    assert "tensorflow" not in names
    # The TF Serving backend has its own protos: its extra needs no TensorFlow either;
    # the tests' stand-in server does.
    assert "tensorflow" not in " ".join(project["optional-dependencies"]["tfserving"])
    assert "tensorflow" in " ".join(project["optional-dependencies"]["test"])


def test_serve_onnx_without_tensorflow(repo, tmp_path):
    add_mlp(repo, "mlp")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(site), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("edgeagent")), "serve", "--repository", str(repo),
         "--port", "0", "--grpc-port", "0", "--data-dir", str(tmp_path / "data"),
         "--cpu-budget", "200MB"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert "listening on" in line, line + proc.stderr.read()
        url = line.split()[3]
        body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, TINY_MLP["inputs"]],
                            "data": [0.5] * TINY_MLP["inputs"]}]}
        req = urllib.request.Request(f"{url}/v2/models/mlp/infer",
                                     data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        end = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:
                    answer = json.loads(resp.read())
                break
            except OSError:
                if time.time() > end:
                    raise
                time.sleep(0.1)
        assert answer["outputs"][0]["shape"] == [1, TINY_MLP["outputs"]]
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert "BLOCKED" not in err, err[-3000:]
