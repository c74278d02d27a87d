"""The TF Serving backend against a TF Serving server over real gRPC on 127.0.0.1.

The server is the real ``tensorflow_model_server`` when one is available
(``EDGEAGENT_TFSERVING_BINARY`` or on PATH), else the stand-in in
``tests/tfserving_standin/server.py`` (TensorFlow's Python runtime behind the same gRPC
protocol). SavedModels are written locally by ``tests/tfserving_standin/savedmodels.py``
in a subprocess, so this process never imports TensorFlow.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from agent.backends import BackendError, BackendUnavailable, InvalidInput, make_backend
from agent.config import (AgentConfig, ConfigError, TfServingSettings, parse_agent_config,
                          parse_model_config)
from agent.modelzoo import mlp_forward as onnx_mlp_forward
from agent.memory import FootprintModel
from tests.helpers import TINY_MLP, AgentServer, add_mlp
from tests.tfserving_standin.savedmodels import mlp_forward

if importlib.util.find_spec("tensorflow") is None or \
        importlib.util.find_spec("tensorflow_serving") is None:
    pytest.skip("needs the tfserving extra: pip install -e '.[tfserving]'",
                allow_module_level=True)

from agent.backends.tfserving import TfServingBackend, TfServingHost  # noqa: E402
from agent.backends.tfserving_process import ManagedServer  # noqa: E402
from agent.backends.tfserving_protos import (from_tensor_proto, protos,  # noqa: E402
                                             to_tensor_proto)

HERE = Path(__file__).parent
STANDIN = HERE / "tfserving_standin" / "server.py"
REAL_BINARY = (os.environ.get("EDGEAGENT_TFSERVING_BINARY")
               or shutil.which("tensorflow_model_server"))
SERVER = REAL_BINARY or f"{shlex.quote(sys.executable)} {shlex.quote(str(STANDIN))}"


def settings(**kw) -> TfServingSettings:
    base = dict(binary=SERVER, start_timeout_seconds=120, load_timeout_seconds=60,
                restart_backoff_seconds=0.2, restart_backoff_max_seconds=2)
    return TfServingSettings(**{**base, **kw})


@pytest.fixture(scope="session")
def savedmodels(tmp_path_factory) -> dict[str, Path]:
    """``repo`` (mlp v1+v2, typed v1, broken v1) and ``weights`` (npz per mlp version)."""
    out = tmp_path_factory.mktemp("savedmodels")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, str(HERE / "tfserving_standin" / "savedmodels.py"),
                           str(out)], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    paths = {k: Path(v) for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}
    broken = paths["repo"] / "broken" / "1"
    shutil.copytree(paths["repo"] / "mlp" / "1", broken)
    (broken / "saved_model.pb").write_bytes(b"this is not a SavedModel")
    return paths


def weights(savedmodels, version: int) -> dict[str, np.ndarray]:
    return dict(np.load(savedmodels["weights"] / f"mlp_v{version}.npz"))


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """One server for the backend tests (started by the first load)."""
    h = TfServingHost(settings(), tmp_path_factory.mktemp("tfserving"))
    yield h
    h.close()


@pytest.fixture(autouse=True)
def _empty_model_list(request):
    """Each test leaves the shared server with no models."""
    yield
    if "host" in request.fixturenames:
        h = request.getfixturevalue("host")
        for name, version in h.desired():
            h.remove(name, version)


def backend(host, savedmodels, name, version=1, **config) -> TfServingBackend:
    return TfServingBackend(name, version, savedmodels["repo"] / name,
                            parse_model_config(config), FootprintModel(), host)


def state(host, name, version) -> str | None:
    return host._version_state(name, version)[0]


def reload_directly(host, keep: list[tuple[str, int, Path]]) -> None:
    """A ReloadConfigRequest listing only ``keep``, sent past the host (as another
    client of the server would)."""
    p = protos()
    config = p.server_config.ModelServerConfig()
    for name, version, path in keep:
        entry = config.model_config_list.config.add(name=name, base_path=str(path),
                                                    model_platform="tensorflow")
        entry.model_version_policy.specific.versions.append(version)
    model_stub, _ = host._stubs_now()
    model_stub.HandleReloadConfigRequest(p.management.ReloadConfigRequest(config=config),
                                         timeout=60)


# -- against a server ------------------------------------------------------------------


def test_load_infer_unload(host, savedmodels):
    b = backend(host, savedmodels, "mlp")
    assert b.estimate() >= b.file_bytes() > 0
    b.load()
    assert [s.as_json() for s in b.inputs] == [{"name": "x", "datatype": "FP32",
                                                "shape": [-1, 4]}]
    assert [s.as_json() for s in b.outputs] == [{"name": "y", "datatype": "FP32",
                                                 "shape": [-1, 3]}]
    assert b.first_run_seconds > 0
    assert b.measured_bytes() >= b.file_bytes()  # the server's RSS delta, floored
    assert state(host, "mlp", 1) == "AVAILABLE"
    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    y = b.infer({"x": x}, {})["y"]
    assert y.dtype == np.float32 and y.shape == (3, 3)
    np.testing.assert_allclose(y, mlp_forward(x, weights(savedmodels, 1)), rtol=1e-5,
                               atol=1e-5)
    y_async = asyncio.run(b.infer_async({"x": x}, {}, None))["y"]
    np.testing.assert_array_equal(y_async, y)
    b.unload()
    assert state(host, "mlp", 1) in (None, "END")
    assert host.desired() == {}
    with pytest.raises(BackendError, match="not loaded"):
        b.infer({"x": x}, {})


def test_bytes_int64_bool_fp16_round_trip(host, savedmodels):
    b = backend(host, savedmodels, "typed")
    b.load()
    assert {s.name: s.datatype for s in b.inputs} == {"text": "BYTES", "count": "INT64"}
    out = b.infer({"text": np.array([b"edge", "agent"], dtype=object),
                   "count": np.array([[1, -2], [3, 0]], np.int64)}, {})
    assert list(out["upper"]) == [b"EDGE", b"AGENT"]
    np.testing.assert_array_equal(out["doubled"], [[2, -4], [6, 0]])
    assert out["doubled"].dtype == np.int64
    np.testing.assert_array_equal(out["positive"], [[True, False], [True, False]])
    np.testing.assert_array_equal(out["half"], np.array([[0.5, -1], [1.5, 0]], np.float16))
    assert out["half"].dtype == np.float16
    b.unload()


def test_bad_input_is_the_requests_fault(host, savedmodels):
    b = backend(host, savedmodels, "mlp")
    b.load()
    with pytest.raises(InvalidInput):
        b.infer({"x": np.zeros((2, 4), np.float64)}, {})
    with pytest.raises(InvalidInput):
        b.infer({"x": np.zeros((2, 5), np.float32)}, {})
    assert b.infer({"x": np.zeros((1, 4), np.float32)}, {})["y"].shape == (1, 3)
    b.unload()


def test_each_reload_sends_the_full_list_and_replaces_it(host, savedmodels):
    mlp1, mlp2 = backend(host, savedmodels, "mlp", 1), backend(host, savedmodels, "mlp", 2)
    typed = backend(host, savedmodels, "typed")
    for b in (mlp1, typed, mlp2):
        b.load()
    listed = {c.name: list(c.model_version_policy.specific.versions)
              for c in host.server_config().model_config_list.config}
    assert listed == {"mlp": [1, 2], "typed": [1]}
    assert [state(host, *k) for k in (("mlp", 1), ("mlp", 2), ("typed", 1))] == \
        ["AVAILABLE"] * 3
    x = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(mlp2.infer({"x": x}, {})["y"],
                               mlp_forward(x, weights(savedmodels, 2)), rtol=1e-5, atol=1e-5)

    mlp1.unload()  # the list without mlp:1: the others stay loaded
    assert state(host, "mlp", 1) in (None, "END")
    assert state(host, "mlp", 2) == state(host, "typed", 1) == "AVAILABLE"

    # The server replaces its whole list: a reload naming only typed unloads mlp:2.
    reload_directly(host, [("typed", 1, savedmodels["repo"] / "typed")])
    assert state(host, "mlp", 2) == "END" and state(host, "typed", 1) == "AVAILABLE"
    # A request for the model it lost gets a 503 and the host gives the list back.
    with pytest.raises(BackendUnavailable, match="restoring"):
        mlp2.infer({"x": x}, {})
    deadline = time.monotonic() + 60
    while True:
        try:
            y = mlp2.infer({"x": x}, {})["y"]
            break
        except BackendUnavailable:
            assert time.monotonic() < deadline, "mlp:2 was never restored"
            time.sleep(0.1)
    np.testing.assert_allclose(y, mlp_forward(x, weights(savedmodels, 2)), rtol=1e-5,
                               atol=1e-5)
    mlp2.unload()
    typed.unload()


def test_failed_load_says_why_and_leaves_the_list(host, savedmodels):
    good = backend(host, savedmodels, "mlp")
    good.load()
    bad = backend(host, savedmodels, "broken")
    assert bad.estimate() > 0  # the file is there; only loading finds it broken
    with pytest.raises(BackendError, match="could not load broken:1") as err:
        bad.load()
    assert "broken" in str(err.value)
    bad.unload()  # what the cache does after a failed load: harmless
    assert ("broken", 1) not in host.desired()
    assert "broken" not in {c.name for c in host.server_config().model_config_list.config}
    assert state(host, "mlp", 1) == "AVAILABLE"
    assert good.infer({"x": np.ones((1, 4), np.float32)}, {})["y"].shape == (1, 3)
    good.unload()


def test_reloads_are_serialised_while_inference_runs(host, savedmodels):
    """Loads from several threads (as the cache's load pool does) all succeed, one
    reload at a time, while another model keeps answering."""
    from concurrent.futures import ThreadPoolExecutor

    serving = backend(host, savedmodels, "typed")
    serving.load()
    loads = [backend(host, savedmodels, "mlp", 1), backend(host, savedmodels, "mlp", 2)]
    feed = {"text": np.array([b"a"], dtype=object), "count": np.array([[1, 1]], np.int64)}
    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(b.load) for b in loads]
        while not all(f.done() for f in futures):
            assert list(serving.infer(feed, {})["upper"]) == [b"A"]
        for f in futures:
            f.result()
    assert sorted(host.desired()) == [("mlp", 1), ("mlp", 2), ("typed", 1)]
    for b in (*loads, serving):
        b.unload()


# -- server start-up faults (no TensorFlow involved) -----------------------------------


def _python(code: str) -> str:
    return f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}"


def test_server_that_exits_at_start_is_a_clear_error(tmp_path):
    h = TfServingHost(settings(binary=_python("import sys; print('bad flag'); sys.exit(3)")),
                      tmp_path)
    try:
        with pytest.raises(BackendError, match="exited with code 3 while starting.*bad flag"):
            h.ensure_up()
    finally:
        h.close()


def test_server_that_never_becomes_ready_times_out(tmp_path):
    h = TfServingHost(settings(binary=_python("import time; time.sleep(60)"),
                               start_timeout_seconds=1.0), tmp_path)
    try:
        started = time.monotonic()
        with pytest.raises(BackendError, match="did not become ready within 1 s"):
            h.ensure_up()
        assert time.monotonic() - started < 15
        assert h.server.pid() is None  # the stuck process was stopped
    finally:
        h.close()


def test_missing_binary_is_a_clear_error(tmp_path):
    h = TfServingHost(settings(binary=str(tmp_path / "no" / "tensorflow_model_server")),
                      tmp_path)
    with pytest.raises(BackendError, match="cannot start TF Serving.*tfserving.binary"):
        h.ensure_up()
    h.close()


#: A gRPC server that serves nothing: enough for process management, no TensorFlow.
FAKE_SERVER = """
import sys, time, grpc
from concurrent import futures
port = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--port="))
server = grpc.server(futures.ThreadPoolExecutor(1))
server.add_insecure_port("127.0.0.1:" + port)
server.start()
time.sleep(120)
"""


def _wait(condition, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_managed_server_restarts_with_backoff(tmp_path):
    server = ManagedServer(_python(FAKE_SERVER), tmp_path, backoff=0.1, backoff_max=30)
    started = []
    server.on_started = lambda: started.append(server.generation)
    try:
        server.ensure_up()
        first = server.pid()
        assert server.up and first is not None and started == [1]
        os.kill(first, signal.SIGKILL)
        _wait(lambda: server.restarts == 1 and server.up)
        assert server.pid() not in (None, first) and started == [1, 2]
        assert server.last_exit == "was killed by signal 9"
        os.kill(server.pid(), signal.SIGKILL)  # dying again soon: the delay has doubled
        _wait(lambda: server.restarts == 2 and server.up)
        assert server._delay == pytest.approx(0.4)
    finally:
        server.close()
    assert server.pid() is None and not server.up


def test_a_server_left_by_a_dead_agent_is_stopped_first(tmp_path):
    config = tmp_path / "models.config"
    orphan = subprocess.Popen([sys.executable, "-c", FAKE_SERVER, "--port=1",
                               f"--model_config_file={config}"])
    # a server left behind has long finished starting; this one may not have: its
    # /proc cmdline is empty for a moment after exec (the kernel sets the argument
    # range after the exec that lets Popen return), and an orphan is known by it
    import psutil
    deadline = time.monotonic() + 10
    while not any(str(config) in a for a in psutil.Process(orphan.pid).cmdline()):
        assert time.monotonic() < deadline, "the stand-in server never showed its cmdline"
        time.sleep(0.01)
    (tmp_path / "server.pid").write_text(f"{orphan.pid}\n")
    server = ManagedServer(_python(FAKE_SERVER), tmp_path)
    try:
        server.ensure_up()
        orphan.wait(10)  # stopped (TimeoutExpired otherwise)
        assert server.pid() != orphan.pid
    finally:
        server.close()


def test_attach_to_a_running_server(host, savedmodels, tmp_path):
    """A second host attached to the managed server of the first (as the agent attaches
    to a server systemd or a container runs): same loader, nothing started or stopped."""
    host.ensure_up()
    attached = TfServingHost(settings(address=host.server.address), tmp_path)
    try:
        b = backend(attached, savedmodels, "mlp", 2)
        b.load()
        assert attached.pid() == host.pid()  # found by its listening port: RSS measurable
        assert b.measured_bytes() >= b.file_bytes()
        x = np.ones((2, 4), np.float32)
        np.testing.assert_allclose(b.infer({"x": x}, {})["y"],
                                   mlp_forward(x, weights(savedmodels, 2)), rtol=1e-5,
                                   atol=1e-5)
        b.unload()
        assert state(host, "mlp", 2) in (None, "END")
    finally:
        attached.close()
    assert host.server.up and host.pid() is not None  # attached: never stopped


def test_status_wait_times_out_with_the_state(tmp_path, monkeypatch):
    h = TfServingHost(settings(), tmp_path)
    monkeypatch.setattr(h, "_version_state", lambda name, version: ("LOADING", ""))
    with pytest.raises(BackendError, match=r"did not become AVAILABLE m:1 within 0.2 s "
                                           r"\(state: LOADING\)"):
        h.wait_for("m", 1, "AVAILABLE", 0.2)
    monkeypatch.setattr(h, "_version_state", lambda name, version: ("END", "bad op"))
    with pytest.raises(BackendError, match="could not load m:1: bad op"):
        h.wait_for("m", 1, "AVAILABLE", 5)


def test_make_backend_needs_the_host(tmp_path):
    with pytest.raises(BackendError, match="needs the agent's TF Serving server"):
        make_backend("tfserving", "m", 1, tmp_path, parse_model_config({}), FootprintModel())


# -- tensors and config ----------------------------------------------------------------


def test_tensor_proto_conversion():
    p = protos()
    for array in (np.arange(6, dtype=np.float32).reshape(2, 3),
                  np.array([[1, -2]], np.int8), np.array([True, False]),
                  np.array([1.5, -2], np.float16), np.array([2**40], np.uint64),
                  np.array([[b"a", b""]], dtype=object)):
        back = from_tensor_proto(p, "t", to_tensor_proto(p, "t", array))
        assert back.dtype == array.dtype and back.shape == array.shape
        np.testing.assert_array_equal(back, array)
    # TensorFlow's typed fields: one value stands for all; half_val holds bit patterns.
    proto = p.tensor.TensorProto(dtype=p.types.DT_FLOAT, float_val=[7.0])
    proto.tensor_shape.dim.add(size=2)
    proto.tensor_shape.dim.add(size=2)
    np.testing.assert_array_equal(from_tensor_proto(p, "t", proto), np.full((2, 2), 7.0))
    half = p.tensor.TensorProto(dtype=p.types.DT_HALF,
                                half_val=np.array([0.5, 2], np.float16).view(np.uint16))
    half.tensor_shape.dim.add(size=2)
    np.testing.assert_array_equal(from_tensor_proto(p, "t", half), [0.5, 2])
    with pytest.raises(BackendError, match="no Open Inference Protocol equivalent"):
        from_tensor_proto(p, "t", p.tensor.TensorProto(dtype=p.types.DT_BFLOAT16))


def test_protos_import_no_tensorflow():
    code = ("import sys; from agent.backends.tfserving_protos import protos; protos(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('tensorflow', 'tensorflow_serving')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=HERE.parent)
    assert out.stdout.strip() == "[]", out.stderr[-2000:]


def test_agent_config_tfserving_section(tmp_path):
    cfg = parse_agent_config({"tfserving": {"binary": "/opt/tfs/tensorflow_model_server",
                                            "grpc_port": 8600, "args": ["--enable_batching"],
                                            "load_timeout_seconds": 30}}, tmp_path / "a.yaml")
    assert cfg.tfserving.binary == "/opt/tfs/tensorflow_model_server"
    assert cfg.tfserving.args == ("--enable_batching",) and cfg.tfserving.grpc_port == 8600
    assert parse_agent_config({}).tfserving == TfServingSettings()
    attach = parse_agent_config({"tfserving": {"address": "127.0.0.1:8500"}})
    assert attach.tfserving.address == "127.0.0.1:8500"
    for bad, key in (({"address": "a:1", "binary": "b"}, "tfserving.address"),
                     ({"address": "nowhere"}, "tfserving.address"),
                     ({"args": "--x"}, "tfserving.args"),
                     ({"load_timeout_seconds": 0}, "tfserving.load_timeout_seconds"),
                     ({"port": 1}, "tfserving.port")):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            parse_agent_config({"tfserving": bad}, "agent.yaml")


# -- through the agent's HTTP API: a repository mixing ONNX and TF models --------------


@pytest.fixture(scope="module")
def agent(savedmodels, tmp_path_factory):
    root = tmp_path_factory.mktemp("agent")
    repo = root / "models"
    add_mlp(repo, "onnxmlp")
    shutil.copytree(savedmodels["repo"] / "mlp", repo / "tfmlp")
    shutil.copytree(savedmodels["repo"] / "broken", repo / "broken")
    config = AgentConfig(repository=repo, data_dir=root / "data", cpu_budget=2**30,
                         infer_threads=2, tfserving=settings())
    server = AgentServer(config, budgets={"cpu": 2**30})
    yield server
    server.close()


def v2_infer(agent, name, x):
    body = {"inputs": [{"name": "x" if name.startswith("tf") else "X", "datatype": "FP32",
                        "shape": list(x.shape), "data": x.reshape(-1).tolist()}]}
    return agent.request("POST", f"/v2/models/{name}/infer", body)


def cache_entry(agent, name):
    status, _, listing = agent.request("GET", "/v1/cache")
    assert status == 200
    return next(e for e in listing if e["name"] == name)


def test_mixed_repository_over_http(agent, savedmodels):
    x = np.array([[0.5, -1, 2, 0.25], [1, 1, 1, 1]], np.float32)
    status, _, body = v2_infer(agent, "tfmlp", x)
    assert status == 200, body
    out = body["outputs"][0]
    assert out["name"] == "y" and out["datatype"] == "FP32" and out["shape"] == [2, 3]
    np.testing.assert_allclose(np.array(out["data"]).reshape(2, 3),
                               mlp_forward(x, weights(savedmodels, 2)), rtol=1e-5, atol=1e-5)
    status, _, body = v2_infer(agent, "onnxmlp", x)
    assert status == 200, body
    np.testing.assert_allclose(np.array(body["outputs"][0]["data"]).reshape(2, -1),
                               onnx_mlp_forward(x, **TINY_MLP), rtol=1e-4, atol=1e-5)
    # TF Serving's own REST predict, served by the agent.
    status, _, body = agent.request("POST", "/v1/models/tfmlp:predict",
                                    {"instances": x.tolist()})
    assert status == 200, body
    np.testing.assert_allclose(np.array(body["predictions"]),
                               mlp_forward(x, weights(savedmodels, 2)), rtol=1e-5, atol=1e-5)
    status, _, meta = agent.request("GET", "/v2/models/tfmlp")
    assert meta["platform"] == "tensorflow_savedmodel" and meta["versions"] == ["1", "2"]
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    tf_entry, onnx_entry = cache_entry(agent, "tfmlp"), cache_entry(agent, "onnxmlp")
    assert tf_entry["backend"] == "tfserving" and tf_entry["state"] == "ready"
    assert onnx_entry["backend"] == "onnx" and onnx_entry["state"] == "ready"
    assert tf_entry["size_bytes"] > 0 and not tf_entry["size_estimated"]


def test_failed_tf_load_is_reported_in_the_cache(agent):
    status, _, body = v2_infer(agent, "broken", np.zeros((1, 4), np.float32))
    assert status == 503 and "could not load broken:1" in body["error"]
    entry = cache_entry(agent, "broken")
    assert entry["state"] == "failed" and "could not load broken:1" in entry["error"]
    assert v2_infer(agent, "tfmlp", np.zeros((1, 4), np.float32))[0] == 200


def test_repository_unload_unloads_from_the_server(agent):
    assert v2_infer(agent, "tfmlp", np.zeros((1, 4), np.float32))[0] == 200
    host = agent.node.tfserving
    assert ("tfmlp", 2) in host.desired()
    status, _, body = agent.request("POST", "/v2/repository/models/tfmlp/unload")
    assert status == 200, body
    assert ("tfmlp", 2) not in host.desired()
    assert state(host, "tfmlp", 2) in (None, "END")
    assert cache_entry(agent, "tfmlp")["state"] == "unloaded"
    status, _, body = v2_infer(agent, "tfmlp", np.zeros((1, 4), np.float32))
    assert status == 200, body  # loads again


def test_server_crash_gives_503_then_restarts_and_restores(agent, savedmodels):
    x = np.ones((1, 4), np.float32)
    assert v2_infer(agent, "onnxmlp", x)[0] == 200  # resident, whatever ran before
    assert v2_infer(agent, "tfmlp", x)[0] == 200
    host = agent.node.tfserving
    old_pid, restarts = host.pid(), host.server.restarts
    os.kill(old_pid, signal.SIGKILL)
    status, headers, body = v2_infer(agent, "tfmlp", x)
    assert status == 503, body
    assert "TF Serving" in body["error"] and headers.get("Retry-After")
    deadline = time.monotonic() + 120
    while status != 200:
        assert time.monotonic() < deadline, f"no restart: {body}"
        time.sleep(0.2)
        status, _, body = v2_infer(agent, "tfmlp", x)
        assert status in (200, 503), body
    np.testing.assert_allclose(np.array(body["outputs"][0]["data"]).reshape(1, 3),
                               mlp_forward(x, weights(savedmodels, 2)), rtol=1e-5, atol=1e-5)
    assert host.server.restarts == restarts + 1 and host.pid() not in (None, old_pid)
    assert state(host, "tfmlp", 2) == "AVAILABLE"
    assert cache_entry(agent, "tfmlp")["state"] == "ready"
    assert cache_entry(agent, "onnxmlp")["state"] == "ready"  # ONNX models never noticed
