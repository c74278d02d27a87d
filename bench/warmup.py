"""Warm-up: what a model's first request pays with ``warmup: none`` (the first request
is the cold run) and with the default warm-up (one run on zeros inside the load,
before the model is reported ready), through a real agent over HTTP on 127.0.0.1.

Per model and mode, repeated: load (``POST /v2/repository/models/X/load``, timed), the
first request, then a warm one; evict. Medians. Two figures per mode, in the same run:
the first request's model run over a warm one (``compute_infer`` of the agent's own
statistics, read between requests: no HTTP noise), and the same for the whole request
as the client sees it.

    .venv/bin/python bench/warmup.py [--reps 7]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.modelzoo import write_mlp  # noqa: E402

MODELS = {
    "mlp-1m": dict(inputs=64, hidden=256, layers=4, outputs=8, seed=1),
    "mlp-17m": dict(inputs=256, hidden=1024, layers=4, outputs=8, seed=2),
    "mlp-58m": dict(inputs=512, hidden=2560, layers=2, outputs=32, seed=4),
}


async def run(repo: Path, reps: int) -> None:
    import aiohttp
    from aiohttp import web

    from agent.config import AgentConfig
    from agent.node.app import NODE, create_app, prepare_process

    prepare_process()
    config = AgentConfig(repository=repo, data_dir=repo.parent / "data", cpu_budget=2**31,
                         restore=False)
    app = create_app(config, budgets={"cpu": 2**31})
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    await app[NODE].wait_ready()
    print(f"{'model':8} {'warmup':8} {'load ms':>8} {'run 1st ms':>10} {'run warm':>8} "
          f"{'ratio':>6} {'req 1st ms':>10} {'req warm':>8} {'ratio':>6}")
    async with aiohttp.ClientSession() as http:
        async def timed(method: str, path: str, body: dict | None = None) -> float:
            started = time.perf_counter()
            async with http.request(method, url + path, json=body) as resp:
                await resp.read()
                assert resp.status == 200, (path, resp.status, await resp.text())
            return (time.perf_counter() - started) * 1000

        async def infer_ns(model: str) -> int:
            async with http.get(f"{url}/v2/models/{model}/stats") as resp:
                stats = (await resp.json())["model_stats"][0]
            return stats["inference_stats"]["compute_infer"]["ns"]

        for name, shape in MODELS.items():
            body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, shape["inputs"]],
                                "data": [0.5] * shape["inputs"]}]}
            for mode in ("none", "default"):
                model = f"{name}-{mode}"
                rows = []
                for _ in range(reps):
                    load = await timed("POST", f"/v2/repository/models/{model}/load")
                    ns0 = await infer_ns(model)
                    first = await timed("POST", f"/v2/models/{model}/infer", body)
                    ns1 = await infer_ns(model)
                    warm = await timed("POST", f"/v2/models/{model}/infer", body)
                    ns2 = await infer_ns(model)
                    await timed("POST", f"/v1/cache/{model}/evict")
                    rows.append((load, (ns1 - ns0) / 1e6, (ns2 - ns1) / 1e6, first, warm))
                load, run1, run2, first, warm = (statistics.median(c) for c in zip(*rows))
                print(f"{name:8} {mode:8} {load:8.1f} {run1:10.3f} {run2:8.3f} "
                      f"{run1 / run2:6.2f} {first:10.2f} {warm:8.2f} {first / warm:6.2f}")
    await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        for name, shape in MODELS.items():
            for mode in ("none", "default"):
                write_mlp(repo / f"{name}-{mode}" / "1" / "model.onnx", **shape)
                (repo / f"{name}-{mode}" / "config.yaml").write_text(f"warmup: {mode}\n")
        asyncio.run(run(repo, args.reps))


if __name__ == "__main__":
    main()
