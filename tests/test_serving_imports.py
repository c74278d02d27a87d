"""The serving agent stays lean (issue 14): ``edgeagent serve`` answers requests and
evicts models without importing numba/llvmlite (the policy kernels run interpreted,
``cachepolicies.jit``) or any other package the default install leaves out
(``tests.helpers.HEAVY``: pandas, pyarrow, scipy, scikit-learn, matplotlib, onnx,
skl2onnx, tqdm, ...) — those belong to the simulator, the coordinator and the tests.

The child gets a ``sitecustomize`` that blocks those imports and reports each attempt on
stderr; the test then drives real inference and eviction through it. A second check runs
the same policy decisions interpreted and compiled and compares them one by one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from tests.helpers import TINY_MLP, add_mlp, add_synthetic, without_packages

ROOT = Path(__file__).resolve().parent.parent


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def test_serving_and_evicting_imports_no_heavy_package(repo, tmp_path):
    add_mlp(repo, "mlp")
    for name in ("a", "b", "c"):
        add_synthetic(repo, name, size_bytes=10_000_000)
    env = without_packages(tmp_path / "site")
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("edgeagent")), "serve", "--repository", str(repo),
         "--port", "0", "--grpc-port", "0", "--data-dir", str(tmp_path / "data"),
         "--cpu-budget", "25MB", "--policy", "cremebrulee"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert "listening on" in line, line + proc.stderr.read()
        url = line.split()[3]
        mlp = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, TINY_MLP["inputs"]],
                           "data": [0.5] * TINY_MLP["inputs"]}]}
        assert _post(f"{url}/v2/models/mlp/infer", mlp)["outputs"][0]["shape"] == [
            1, TINY_MLP["outputs"]]
        synthetic = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 2],
                                 "data": [1, 2]}]}
        for name in ["a", "b", "c", "a", "c", "b", "a"]:  # two of three fit: evictions
            _post(f"{url}/v2/models/{name}/infer", synthetic)
        with urllib.request.urlopen(f"{url}/v1/cache", timeout=30) as resp:
            listing = json.loads(resp.read())
        models = listing["models"] if isinstance(listing, dict) else listing
        assert sum(m["evictions"] for m in models) >= 2, models  # a or b goes, comes back
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err[-3000:]
    assert "BLOCKED" not in err, err[-3000:]


DECISIONS = '''
import json, random, sys
from cachepolicies import jit
from cachepolicies.registry import make_policy
rng = random.Random(7)
uniform = [(rng.randrange(40), i * 0.3 + rng.random()) for i in range(2000)]
sizes = {k: rng.randrange(1, 100) for k in range(40)}
traces = {  # (key, time) requests: even popularity, a heavy tail, a working set that moves
    "uniform": uniform,
    "heavy-tailed": [(min(int(rng.paretovariate(0.6)), 40) - 1, i * 0.1) for i in range(3000)],
    "shifting": [(((i // 300) * 5 + rng.randrange(16)) % 40, i * 0.5) for i in range(2400)],
}
out = {"compiled": jit.COMPILED, "numba": "numba" in sys.modules}
for trace, requests in traces.items():
    for spec in sys.argv[1:]:
        future = [key for key, _ in requests]
        policy, resident, used, victims = make_policy(spec, future=future), set(), 0, []
        for key, now in requests:
            policy.record_access(key, now)
            if key in resident:
                continue
            if used + sizes[key] > 500:
                chosen = policy.choose_victims(used + sizes[key] - 500, now,
                                               lambda k: k % 7 != 0)
                for v in chosen:
                    policy.remove(v)
                    resident.discard(v)
                    used -= sizes[v]
                victims.append([str(v) for v in chosen] + [policy.priority(key, now)])
            policy.admit(key, sizes[key], sizes[key] / 100, now)
            resident.add(key)
            used += sizes[key]
        out[f"{trace} {spec}"] = victims
print(json.dumps(out))
'''


def test_interpreted_kernels_decide_as_compiled():
    """Production's mode (interpreted) against the simulator's (compiled), decision by
    decision, on three traces of different shape."""
    specs = ["lru", "cremebrulee", "cremebrulee:rate=cumulative", "gdsf", "random:seed=3",
             "popularity", "beladymin", "cremebrulee-oracle"]
    runs = {}
    for jit in ("0", "1"):
        env = {**os.environ, "EDGEAGENT_JIT": jit, "PYTHONPATH": str(ROOT)}
        done = subprocess.run([sys.executable, "-c", DECISIONS, *specs], env=env,
                              capture_output=True, text=True, timeout=600, check=True)
        runs[jit] = json.loads(done.stdout)
    assert (runs["0"]["compiled"], runs["0"]["numba"]) == (False, False)
    assert (runs["1"]["compiled"], runs["1"]["numba"]) == (True, True)
    for trace in ("uniform", "heavy-tailed", "shifting"):
        for spec in specs:
            run = f"{trace} {spec}"
            assert len(runs["0"][run]) > 100, run  # the budget forces many evictions
            assert runs["0"][run] == runs["1"][run], run
