"""Peer servers for ``bench/pressure.py``: the same ONNX repository served by Ray Serve
model multiplexing or by MLServer behind an LRU-by-count wrapper, on loopback.

Run by ``bench/pressure.py`` with an interpreter that has ``ray[serve]`` or ``mlserver``
(plus onnxruntime, numpy, aiohttp); it imports nothing from this project, so it runs from
a separate virtual environment too. Each mode serves, on ``--port``:

  GET  /ready   200 once the models can be requested
  GET  /stats   {"loads": N}: model loads performed so far
  ray:      POST /infer with header ``serve_multiplexed_model_id: <model>``, a KServe v2
            JSON body (``inputs[0]`` → ``X``), ``@serve.multiplexed(
            max_num_models_per_replica=--max-models)``, one replica, onnxruntime sessions
            (1 intra-op thread, as the agent's default).
  mlserver: POST /v2/models/<model>/infer. A custom MLServer runtime (``OnnxModel``)
            holds one onnxruntime session per model; MLServer starts with no model loaded
            (``load_models_at_startup: false``, ``parallel_workers: 0``), and a small
            aiohttp wrapper in front of it keeps at most ``--max-models`` loaded: on a
            miss it loads the model through MLServer's repository API and unloads the
            least recently used idle ones, then forwards the request.

    python bench/pressure_peers.py ray --repo REPO --port 8100 --max-models 6 --work DIR
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def onnx_models(repo: Path) -> dict[str, Path]:
    """name -> highest version's model.onnx in a ``<repo>/<name>/<version>/`` layout."""
    out = {}
    for d in sorted(p for p in repo.iterdir() if p.is_dir()):
        versions = sorted((v for v in d.iterdir() if v.name.isdigit()), key=lambda v: int(v.name))
        if versions and (versions[-1] / "model.onnx").exists():
            out[d.name] = versions[-1] / "model.onnx"
    return out


def new_session(path: str):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def wait_for_stop() -> None:
    stop = {"now": False}

    def handler(*_):
        stop["now"] = True

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    while not stop["now"]:
        time.sleep(0.2)


# -- Ray Serve ---------------------------------------------------------------------------

def serve_ray(args) -> None:
    import numpy as np
    import ray
    from ray import serve
    from starlette.responses import JSONResponse, PlainTextResponse

    models = {k: str(v) for k, v in onnx_models(Path(args.repo)).items()}
    import tempfile

    # AF_UNIX socket paths must stay under 108 bytes: a short temporary directory
    ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=100 * 2**20, _temp_dir=ray_tmp)
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    max_models = args.max_models

    @serve.deployment(num_replicas=1, max_ongoing_requests=256,
                      ray_actor_options={"num_cpus": 0})
    class Multiplexed:
        def __init__(self, paths: dict[str, str]):
            self.paths = paths
            self.loads = 0

        @serve.multiplexed(max_num_models_per_replica=max_models)
        async def get_model(self, model_id: str):
            self.loads += 1
            return await asyncio.get_running_loop().run_in_executor(
                None, new_session, self.paths[model_id])

        async def __call__(self, request):
            path = request.url.path.rstrip("/")
            if path.endswith("/stats"):
                return JSONResponse({"loads": self.loads})
            if path.endswith("/ready"):
                return PlainTextResponse("ok")
            model_id = serve.get_multiplexed_model_id()
            if model_id not in self.paths:
                return JSONResponse({"error": f"unknown model {model_id!r}"}, status_code=404)
            session = await self.get_model(model_id)
            doc = json.loads(await request.body())
            inp = doc["inputs"][0]
            x = np.asarray(inp["data"], np.float32).reshape(inp["shape"])
            (y,) = await asyncio.get_running_loop().run_in_executor(
                None, session.run, None, {"X": x})
            return JSONResponse({"model_name": model_id, "outputs": [
                {"name": "Y", "datatype": "FP32", "shape": list(y.shape),
                 "data": y.ravel().tolist()}]})

    serve.run(Multiplexed.bind(models), name="pressure", route_prefix="/")
    print(f"ray serve ready on 127.0.0.1:{args.port} with {len(models)} models, "
          f"max_num_models_per_replica={max_models}", flush=True)
    try:
        wait_for_stop()
    finally:
        import shutil

        serve.shutdown()
        ray.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)


# -- MLServer ----------------------------------------------------------------------------

try:  # the runtime class MLServer imports as ``pressure_peers.OnnxModel``
    from mlserver import MLModel
    from mlserver.codecs import NumpyCodec
    from mlserver.types import InferenceRequest, InferenceResponse

    class OnnxModel(MLModel):
        async def load(self) -> bool:
            uri = self.settings.parameters.uri
            self._session = await asyncio.to_thread(new_session, uri)
            return True

        async def predict(self, payload: InferenceRequest) -> InferenceResponse:
            x = NumpyCodec.decode_input(payload.inputs[0])
            (y,) = await asyncio.to_thread(self._session.run, None, {"X": x})
            return InferenceResponse(model_name=self.name,
                                     outputs=[NumpyCodec.encode_output("Y", y)])
except ImportError:  # ray mode, or run without mlserver
    pass


def free_port() -> int:
    """A loopback port free now, for MLServer, which must be told its ports before it
    starts. A copy of bench/pressure.py's: this script imports nothing from the project
    (it runs in the peers' own environment)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_mlserver(args) -> None:
    import aiohttp
    from aiohttp import web

    work = Path(args.work)
    models = onnx_models(Path(args.repo))
    root = work / "mlserver-models"
    for name, path in models.items():
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "model-settings.json").write_text(json.dumps({
            "name": name, "implementation": "pressure_peers.OnnxModel",
            "parameters": {"uri": str(path)}}))
    ml_port = free_port()
    (root / "settings.json").write_text(json.dumps({
        "http_port": ml_port, "grpc_port": free_port(), "host": "127.0.0.1",
        "metrics_port": free_port(), "load_models_at_startup": False,
        "parallel_workers": 0, "debug": False}))
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parent),
                                          os.environ.get("PYTHONPATH", "")])}
    mlserver_bin = Path(sys.executable).with_name("mlserver")
    proc = subprocess.Popen([str(mlserver_bin), "start", str(root)], env=env, cwd=work)
    ml = f"http://127.0.0.1:{ml_port}"

    loaded: collections.OrderedDict[str, None] = collections.OrderedDict()
    in_flight: collections.Counter[str] = collections.Counter()
    loading: dict[str, asyncio.Task] = {}
    unloading: dict[str, asyncio.Future] = {}  # a reload waits for the unload to finish
    stats = {"loads": 0, "unloads": 0}
    lock = asyncio.Lock()

    async def ensure(session: aiohttp.ClientSession, name: str) -> None:
        async with lock:
            if name in loaded:
                loaded.move_to_end(name)
                return
            task = loading.get(name)
            if task is None:
                task = asyncio.ensure_future(load(session, name))
                loading[name] = task
        await asyncio.shield(task)

    async def load(session: aiohttp.ClientSession, name: str) -> None:
        try:
            pending = unloading.get(name)
            if pending is not None:
                await pending
            async with session.post(f"{ml}/v2/repository/models/{name}/load") as r:
                body = await r.read()
                if r.status != 200:
                    raise web.HTTPInternalServerError(
                        text=json.dumps({"error": body.decode(errors="replace")}),
                        content_type="application/json")
            stats["loads"] += 1
            async with lock:
                loaded[name] = None
                loaded.move_to_end(name)
                victims = []
                for key in list(loaded):
                    if len(loaded) - len(victims) <= args.max_models:
                        break
                    if key != name and in_flight[key] == 0:
                        victims.append(key)
                for key in victims:
                    del loaded[key]
                    unloading[key] = asyncio.get_running_loop().create_future()
            for key in victims:
                try:
                    async with session.post(
                            f"{ml}/v2/repository/models/{key}/unload") as r:
                        await r.read()
                    stats["unloads"] += 1
                finally:
                    unloading.pop(key).set_result(None)
        finally:
            loading.pop(name, None)

    async def infer(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        session = request.app["session"]
        body = await request.read()
        in_flight[name] += 1
        try:
            await ensure(session, name)
            async with session.post(f"{ml}/v2/models/{name}/infer", data=body,
                                    headers={"Content-Type": "application/json"}) as r:
                return web.Response(body=await r.read(), status=r.status,
                                    content_type="application/json")
        finally:
            in_flight[name] -= 1

    async def ready(request: web.Request) -> web.Response:
        try:
            async with request.app["session"].get(f"{ml}/v2/health/ready") as r:
                return web.Response(status=r.status, text="ok" if r.status == 200 else "no")
        except aiohttp.ClientError:
            return web.Response(status=503, text="no")

    async def get_stats(request: web.Request) -> web.Response:
        return web.json_response({**stats, "resident": list(loaded)})

    async def on_startup(app: web.Application) -> None:
        app["session"] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=300))

    async def on_cleanup(app: web.Application) -> None:
        await app["session"].close()

    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_post("/v2/models/{name}/infer", infer)
    app.router.add_get("/ready", ready)
    app.router.add_get("/stats", get_stats)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    try:
        web.run_app(app, host="127.0.0.1", port=args.port, print=None, access_log=None)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("peer", choices=["ray", "mlserver"])
    ap.add_argument("--repo", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--max-models", type=int, required=True)
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    Path(args.work).mkdir(parents=True, exist_ok=True)
    {"ray": serve_ray, "mlserver": serve_mlserver}[args.peer](args)


if __name__ == "__main__":
    main()
