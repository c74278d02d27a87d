"""Cold start: the agent's observed load (what a cold request waits for) vs raw ONNX
Runtime session creation + first run, same models, same process, same options.

For each model, alternately: raw (create session, run once, drop it) and agent (cache
load via ``ensure_loaded`` then evict). Medians of the repetitions; target (issue 10):
agent/raw <= 1.1 for models of 10 MB and more, agent - raw <= 2 ms for smaller ones. ``agent`` is the wall time of ``ensure_loaded``: reservation, policy, RSS
windows and malloc_trim included.

    .venv/bin/python bench/cold_start.py [--reps 7]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.modelzoo import write_mlp  # noqa: E402
from agent.node.cache import ModelCache  # noqa: E402
from agent.memory import malloc_trim, tune_malloc  # noqa: E402
from agent.node.repository import scan_repository  # noqa: E402

MODELS = {
    "mlp-1m": dict(inputs=64, hidden=256, layers=4, outputs=8, seed=1),
    "mlp-17m": dict(inputs=256, hidden=1024, layers=4, outputs=8, seed=2),
    "mlp-58m": dict(inputs=512, hidden=2560, layers=2, outputs=32, seed=4),
}


def raw_load(path: Path, inputs: int) -> float:
    import onnxruntime as ort

    t = time.perf_counter()
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    sess.run(None, {"X": np.zeros((1, inputs), np.float32)})
    took = time.perf_counter() - t
    del sess
    malloc_trim()
    return took


async def run(repo: Path, reps: int) -> None:
    from agent.backends.onnx import prime_runtime

    tune_malloc()
    prime_runtime()
    cache = ModelCache(scan_repository(repo), {"cpu": 2**31})
    print(f"{'model':8} {'file MB':>8} {'raw ms':>8} {'agent ms':>9} {'(load_s ms)':>11} "
          f"{'ratio':>6}")
    verdicts = []
    for name, shape in MODELS.items():
        path = repo / name / "1" / "model.onnx"
        raw, agent, inner = [], [], []
        for _ in range(reps):
            raw.append(raw_load(path, shape["inputs"]))
            t = time.perf_counter()
            entry = await cache.ensure_loaded(name)
            agent.append(time.perf_counter() - t)
            inner.append(entry.account.load_seconds)
            await cache.evict(name)
        r, a = statistics.median(raw), statistics.median(agent)
        big = path.stat().st_size >= 10e6
        verdicts.append(a / r <= 1.1 if big else a - r <= 0.002)
        print(f"{name:8} {path.stat().st_size / 1e6:8.1f} {r * 1000:8.2f} {a * 1000:9.2f} "
              f"{statistics.median(inner) * 1000:11.2f} {a / r:6.3f}")
    print(f"{sum(verdicts)} of {len(verdicts)} models within target (<= 1.1x from 10 MB, "
          "else <= +2 ms)")
    await cache.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        for name, shape in MODELS.items():
            write_mlp(repo / name / "1" / "model.onnx", **shape)
        asyncio.run(run(repo, args.reps))


if __name__ == "__main__":
    main()
