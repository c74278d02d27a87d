"""GPU memory accounting.

The first part runs everywhere: the accounting logic (per-process NVML figures, the
fallback, the context overhead billed to the pool, per-session limits, budgets) is driven
through ``FakeNvml``, a test double of ``pynvml``, because the machine these tests are
written on has no GPU. The last test needs onnxruntime-gpu and an NVIDIA GPU (issue 11,
point 5) and skips cleanly without them.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

from agent.backends import load_measured, make_backend
from agent.backends import onnx as onnx_backend
from agent.config import AgentConfig, ConfigError, parse_agent_config, parse_model_config
from agent.memory import (FootprintModel, GpuAccounting, GpuMemoryReader, MemoryMeter, MiB,
                          gpu_budgets)
from tests.helpers import add_mlp

GiB = 2**30
OUR_PID = os.getpid()


class FakeNvml:
    """A double of ``pynvml`` (no GPU exists here): devices with a total, and bytes per
    pid on each; ``per_process=False`` makes the per-process query unsupported, as some
    drivers (vGPU, WSL) do."""

    class NVMLError(Exception):
        pass

    def __init__(self, devices: int = 1, total: int = 80 * GiB, per_process: bool = True,
                 works: bool = True) -> None:
        self.total, self.per_process, self.works = total, per_process, works
        self.usage: list[dict[int, int]] = [{} for _ in range(devices)]

    def nvmlInit(self) -> None:
        if not self.works:
            raise self.NVMLError("NVML Shared Library Not Found")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.usage)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        used = sum(self.usage[handle].values())
        return SimpleNamespace(total=self.total, used=used, free=self.total - used)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        if not self.per_process:
            raise self.NVMLError("Not Supported")
        return [SimpleNamespace(pid=pid, usedGpuMemory=used)
                for pid, used in self.usage[handle].items() if used]

    def allocate(self, device: int, pid: int, nbytes: int) -> None:
        self.usage[device][pid] = self.usage[device].get(pid, 0) + nbytes


def test_reader_counts_only_this_process():
    nvml = FakeNvml(devices=2)
    reader = GpuMemoryReader(nvml)
    assert reader.devices() == {"cuda:0": 80 * GiB, "cuda:1": 80 * GiB}
    assert reader.used("cuda:0") == 0  # no context yet: not listed
    nvml.allocate(0, OUR_PID, 300 * MiB)
    nvml.allocate(0, 4242, 5 * GiB)  # another process on the same GPU
    assert reader.used("cuda:0") == 300 * MiB
    assert reader.device_used("cuda:0") == 300 * MiB + 5 * GiB
    assert reader.used("cuda:0", pid=4242) == 5 * GiB
    assert reader.used("cuda:1") == 0


def test_reader_falls_back_to_device_wide_with_one_warning(caplog):
    nvml = FakeNvml(per_process=False)
    reader = GpuMemoryReader(nvml)
    nvml.allocate(0, OUR_PID, 100 * MiB)
    nvml.allocate(0, 4242, 1 * GiB)
    with caplog.at_level(logging.WARNING, "edgeagent.memory"):
        assert reader.process_used("cuda:0") is None
        assert reader.used("cuda:0") == 100 * MiB + 1 * GiB
        assert reader.used("cuda:0") == 100 * MiB + 1 * GiB
    warnings = [r for r in caplog.records if "no per-process memory" in r.getMessage()]
    assert len(warnings) == 1


def test_reader_sees_a_hidden_pid_once_it_holds_a_context():
    """In a PID namespace NVML lists host pids: once we made a context and are not
    listed, per-process figures are unavailable (not zero)."""
    nvml = FakeNvml()
    reader = GpuMemoryReader(nvml)
    nvml.allocate(0, 99999, 700 * MiB)  # our context, under the host's pid for us
    assert reader.process_used("cuda:0") == 0
    reader.note_context("cuda:0")
    assert reader.process_used("cuda:0") is None
    assert reader.used("cuda:0") == 700 * MiB


def test_reader_without_nvml_knows_nothing():
    reader = GpuMemoryReader(FakeNvml(works=False))
    assert reader.devices() == {} and reader.used("cuda:0") is None


def test_context_overhead_is_measured_once_and_taken_off_the_session_limit():
    nvml = FakeNvml()
    gpu = GpuAccounting(GpuMemoryReader(nvml), {"cuda:0": 2 * GiB})
    nvml.allocate(0, 4242, 3 * GiB)  # noise from another process: never ours
    calls = []

    def set_up():
        calls.append(1)
        nvml.allocate(0, OUR_PID, 600 * MiB)

    assert gpu.context_overhead("cuda:0") is None
    assert gpu.session_limit("cuda:0") == 2 * GiB
    assert gpu.ensure_context("cuda:0", set_up) == 600 * MiB
    assert gpu.ensure_context("cuda:0", set_up) == 600 * MiB and calls == [1]
    assert gpu.context_overhead("cuda:0") == 600 * MiB
    assert gpu.session_limit("cuda:0") == 2 * GiB - 600 * MiB
    assert gpu.session_limit("cuda:1") is None


def test_context_overhead_uses_device_figures_where_per_process_ones_are_hidden():
    nvml = FakeNvml(per_process=False)
    gpu = GpuAccounting(GpuMemoryReader(nvml), {})
    nvml.allocate(0, 4242, 1 * GiB)
    assert gpu.ensure_context("cuda:0", lambda: nvml.allocate(0, OUR_PID, 500 * MiB)) \
        == 500 * MiB


@pytest.fixture
def fake_cuda(monkeypatch):
    """The ONNX backend on ``cuda:0`` with ORT's CUDA parts replaced by allocations on a
    ``FakeNvml``: priming makes a 600 MiB context, a session its weights + 20 MiB."""
    nvml = FakeNvml()
    seen: dict = {}

    def prime(device):
        nvml.allocate(0, OUR_PID, 600 * MiB)

    def load_session(self):
        seen["providers"] = self._providers()
        nvml.allocate(0, OUR_PID, self.weight_bytes() + 20 * MiB)
        nvml.allocate(0, 4242, 1 * GiB)  # another process grows meanwhile
        self.session = object()

    monkeypatch.setattr(onnx_backend, "prime_cuda", prime)
    monkeypatch.setattr(onnx_backend.OnnxBackend, "_check_cuda", lambda self: None)
    monkeypatch.setattr(onnx_backend.OnnxBackend, "_load_session", load_session)
    return SimpleNamespace(nvml=nvml, seen=seen)


def test_a_cuda_load_bills_the_model_its_own_bytes_and_the_pool_the_context(repo, fake_cuda):
    add_mlp(repo, "g", inputs=256, hidden=1024, layers=2, outputs=8)
    gpu = GpuAccounting(GpuMemoryReader(fake_cuda.nvml), {"cuda:0": 4 * GiB})
    footprints = FootprintModel()
    config = parse_model_config({"device": "cuda:0"})
    backend = make_backend("onnx", "g", 1, repo / "g", config, footprints, gpu=gpu)
    weights = backend.weight_bytes()
    assert backend.lower_bound() == weights > 4 * MiB
    assert backend.estimate() == int(48 * MiB + 1.05 * weights)  # the cuda prior
    assert backend.set_up_device() == 600 * MiB  # what the cache bills to the pool
    result = load_measured(backend, MemoryMeter(lambda: 0))
    assert result.size_bytes == backend.measured_bytes() == weights + 20 * MiB
    options = dict(fake_cuda.seen["providers"][0][1])
    assert options["arena_extend_strategy"] == "kSameAsRequested"
    assert options["gpu_mem_limit"] == str(4 * GiB - 600 * MiB)
    # The measurement teaches the cuda factor, not the cpu one.
    assert set(footprints.to_json()) == {"onnx/cuda"}
    second = make_backend("onnx", "g", 1, repo / "g", config, footprints, gpu=gpu)
    assert abs(second.estimate() - result.size_bytes) < 0.05 * result.size_bytes
    second.load()  # the context is not set up (nor billed) twice
    assert second.measured_bytes() == weights + 20 * MiB


def test_gpu_budgets_one_size_per_device_or_default():
    devices = {"cuda:0": 80 * GiB, "cuda:1": 40 * GiB}
    assert gpu_budgets(None, devices, 0.25) == {"cuda:0": 60 * GiB, "cuda:1": 30 * GiB}
    assert gpu_budgets(6 * GiB, devices, 0.25) == {"cuda:0": 6 * GiB, "cuda:1": 6 * GiB}
    assert gpu_budgets({"cuda:1": 4 * GiB, "cuda:7": GiB}, devices, 0.5) == {
        "cuda:0": 40 * GiB, "cuda:1": 4 * GiB}


def test_gpu_budget_config_forms():
    assert parse_agent_config({"gpu_budget": "6GiB"}).gpu_budget == 6 * GiB
    assert parse_agent_config({"gpu_budget": "cuda:0=6GiB,cuda:1=4GiB"}).gpu_budget == {
        "cuda:0": 6 * GiB, "cuda:1": 4 * GiB}
    assert parse_agent_config({"gpu_budget": {"cuda": "1GiB"}}).gpu_budget == {
        "cuda:0": GiB}
    for bad in ("cpu=1GB", {}, "cuda:0=lots", 1.5, "cuda:x=1GB"):
        with pytest.raises(ConfigError, match="gpu_budget"):
            parse_agent_config({"gpu_budget": bad})
    assert parse_agent_config({"idle_unload_s": 30}).idle_unload_s == 30
    assert parse_model_config({"idle_unload_s": 5}).idle_unload_s == 5


def test_node_builds_per_device_budgets_from_gpu_budget():
    from agent.node.node import default_budgets

    reader = GpuMemoryReader(FakeNvml(devices=2, total=10 * GiB))
    config = AgentConfig(cpu_budget=GiB, gpu_budget={"cuda:1": 3 * GiB}, memory_margin=0.5)
    assert default_budgets(config, reader) == {"cpu": GiB, "cuda:0": 5 * GiB,
                                               "cuda:1": 3 * GiB}


def test_serve_rejects_a_bad_gpu_budget_flag():
    from agent.cli import main

    result = CliRunner().invoke(main, ["serve", "--gpu-budget", "cuda:0=plenty"])
    assert result.exit_code == 2 and "--gpu-budget" in result.output


# -- on a real GPU ---------------------------------------------------------------------


def _cuda_available() -> bool:
    import onnxruntime as ort

    return ("CUDAExecutionProvider" in ort.get_available_providers()
            and bool(GpuMemoryReader().devices()))


ROOT = Path(__file__).resolve().parents[1]
#: 4 × 4096² float32 weights: 256 MiB (+ 64 KiB of biases).
BIG = dict(inputs=4096, hidden=4096, layers=3, outputs=4096)
CONTEXT_PROBE = """
import json, os
from agent.backends.onnx import prime_cuda
from agent.memory import GpuMemoryReader
prime_cuda("cuda:0")
print(json.dumps(GpuMemoryReader().used("cuda:0", os.getpid())))
"""


class Agent:
    """``edgeagent serve`` in a subprocess (its own pid, so NVML's per-process figure
    is the agent's alone)."""

    def __init__(self, repo: Path, data: Path, gpu_budget: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from agent.cli import main; main()", "serve",
             "--repository", str(repo), "--data-dir", str(data), "--port", "0",
             "--grpc-port", "0",
             "--cpu-budget", "8GiB", "--gpu-budget", f"cuda:0={gpu_budget}",
             "--log-level", "info"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        for line in self.proc.stdout:
            match = re.search(r"listening on (http://\S+)", line)
            if match:
                self.url = match.group(1)
                break
        else:
            raise AssertionError("the agent did not start")
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        try:
            with urllib.request.urlopen(req, timeout=600) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"{}")

    def infer(self, name: str) -> int:
        x = np.ones((1, BIG["inputs"]), np.float32)
        status, _ = self.call("POST", f"/v2/models/{name}/infer", {"inputs": [
            {"name": "X", "datatype": "FP32", "shape": [1, BIG["inputs"]],
             "data": x.ravel().tolist()}]})
        return status

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


@pytest.mark.skipif(not _cuda_available(),
                    reason="needs onnxruntime-gpu (CUDAExecutionProvider) and an NVIDIA GPU")
def test_gpu_budget_holds_for_the_process(tmp_path):  # pragma: no cover - no GPU here
    names = [f"big{i}" for i in range(8)]
    repo = tmp_path / "repo"
    for i, name in enumerate(names):
        add_mlp(repo, name, config={"device": "cuda:0"}, seed=i, **BIG)
    reader = GpuMemoryReader()
    probe = subprocess.run([sys.executable, "-c", CONTEXT_PROBE], cwd=ROOT, text=True,
                           capture_output=True, check=True)
    context = int(probe.stdout.strip().splitlines()[-1])
    model = 256 * MiB

    # 1. Accounting: an agent with room for all 8; each load's NVML delta vs its size.
    agent = Agent(repo, tmp_path / "data1", context + 8 * 2 * model)
    try:
        errors = {}
        for name in names:
            before = reader.used("cuda:0", agent.proc.pid)
            assert agent.infer(name) == 200
            delta = reader.used("cuda:0", agent.proc.pid) - before
            status, info = agent.call("GET", f"/v1/cache/{name}")
            # The first load also made the CUDA context: the pool's, not the model's.
            overhead = ((info.get("memory") or {}).get("overhead_bytes") or context) \
                if name == names[0] else 0
            errors[name] = (info["size_bytes"], delta - overhead)
        print("accounted vs NVML delta (MiB):",
              {n: (a / MiB, d / MiB) for n, (a, d) in errors.items()})
        for name, (accounted, delta) in errors.items():
            assert abs(accounted - delta) <= 0.10 * delta, (name, accounted, delta)
    finally:
        agent.close()

    # 2. Pressure: room for 3; sequential, then 4 concurrent clients; sample NVML.
    budget = context + int(3.5 * model)
    agent = Agent(repo, tmp_path / "data2", budget)
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(reader.used("cuda:0", agent.proc.pid) or 0)
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        statuses = [agent.infer(name) for _ in range(2) for name in names]
        rng = random.Random(0)
        plan = [[rng.choice(names) for _ in range(12)] for _ in range(4)]
        with ThreadPoolExecutor(4) as pool:
            statuses += [s for part in pool.map(lambda p: [agent.infer(n) for n in p], plan)
                         for s in part]
        status, info = agent.call("GET", f"/v1/cache/{names[0]}")
        overhead = (info.get("memory") or {}).get("overhead_bytes") or context
    finally:
        stop.set()
        sampler.join(5)
        agent.close()
    print(f"GPU budget {budget / MiB:.0f} MiB, overhead {overhead / MiB:.0f} MiB, "
          f"peak process usage {max(samples) / MiB:.0f} MiB over {len(samples)} samples")
    assert statuses == [200] * len(statuses)
    assert max(samples) <= budget + overhead
