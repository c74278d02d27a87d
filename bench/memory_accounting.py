"""Memory accounting: the agent's estimate and measurement vs the true RSS delta.

True delta: a fresh process (same malloc tuning, ONNX Runtime primed) loads only that
model (session + first run) and reports its RSS growth. Agent: one ModelCache loads the
models one after another (as the live agent does), then evicts each, reporting how far
process RSS went down. Targets: |measured - true| / true <= 10 %; the first estimate
(from the graph's weights, before the model was ever loaded) within 25 % of true.

    .venv/bin/python bench/memory_accounting.py
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.modelzoo import write_mlp  # noqa: E402
from agent.node.cache import ModelCache  # noqa: E402
from agent.memory import MemoryMeter, tune_malloc  # noqa: E402
from agent.node.repository import scan_repository  # noqa: E402

MODELS = {
    "mlp-4m": dict(inputs=128, hidden=512, layers=4, outputs=8, seed=1),
    "mlp-17m": dict(inputs=256, hidden=1024, layers=4, outputs=8, seed=2),
    "mlp-36m": dict(inputs=256, hidden=2048, layers=2, outputs=16, seed=3),
    "mlp-58m": dict(inputs=512, hidden=2560, layers=2, outputs=32, seed=4),
}

TRUE_DELTA = """
import sys, json, numpy as np, onnxruntime as ort, psutil
from agent.memory import tune_malloc, malloc_trim
from agent.backends.onnx import prime_runtime
tune_malloc(); prime_runtime(); malloc_trim()
p = psutil.Process(); r0 = p.memory_info().rss
so = ort.SessionOptions(); so.intra_op_num_threads = so.inter_op_num_threads = 1
so.add_session_config_entry("session.intra_op.allow_spinning", "0")
s = ort.InferenceSession(sys.argv[1], so, providers=["CPUExecutionProvider"])
s.run(None, {"X": np.zeros((1, int(sys.argv[2])), np.float32)})
malloc_trim()
print(json.dumps(p.memory_info().rss - r0))
"""


def true_delta(path: Path, inputs: int, reps: int = 3) -> int:
    root = str(Path(__file__).resolve().parents[1])
    values = [int(subprocess.run([sys.executable, "-c", TRUE_DELTA, str(path), str(inputs)],
                                 capture_output=True, text=True, check=True, cwd=root
                                 ).stdout) for _ in range(reps)]
    return int(statistics.median(values))


async def agent_side(repo: Path) -> list[dict]:
    from agent.backends.onnx import prime_runtime

    tune_malloc()
    prime_runtime()
    meter = MemoryMeter()
    cache = ModelCache(scan_repository(repo), {"cpu": 4 * 2**30}, meter=meter,
                       load_concurrency=1)
    rows = []
    for name in MODELS:
        entry = cache.entry(name)
        backend = cache.backend_factory("onnx", name, 1, entry.spec.path, entry.spec.config,
                                        cache.footprints)
        estimate = backend.estimate()
        await cache.ensure_loaded(name)
        rows.append({"model": name, "file_bytes": backend.weight_bytes(), "estimate": estimate,
                     "measured": entry.account.size_bytes,
                     "estimated": entry.account.size_estimated})
    for row in rows:
        before = meter.rss()
        await cache.evict(row["model"])
        row["rss_freed"] = before - meter.rss()
    await cache.close()
    return rows


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        for name, shape in MODELS.items():
            write_mlp(repo / name / "1" / "model.onnx", **shape)
        rows = asyncio.run(agent_side(repo))
        for row in rows:
            row["true"] = true_delta(repo / row["model"] / "1" / "model.onnx",
                                     MODELS[row["model"]]["inputs"])
    mib = 2**20
    print(f"{'model':10} {'weights':>8} {'true':>8} {'estimate':>9} {'est_err':>8} "
          f"{'measured':>9} {'meas_err':>8} {'freed':>8} {'freed/acc':>9}")
    for r in rows:
        est_err = (r["estimate"] - r["true"]) / r["true"]
        meas_err = (r["measured"] - r["true"]) / r["true"]
        r.update(estimate_error=est_err, measured_error=meas_err)
        print(f"{r['model']:10} {r['file_bytes']/mib:7.1f}M {r['true']/mib:7.1f}M "
              f"{r['estimate']/mib:8.1f}M {est_err:+8.1%} {r['measured']/mib:8.1f}M "
              f"{meas_err:+8.1%} {r['rss_freed']/mib:7.1f}M {r['rss_freed']/r['measured']:9.0%}")
    worst = max(abs(r["measured_error"]) for r in rows)
    worst_estimate = max(abs(r["estimate_error"]) for r in rows)
    print(f"worst |measured - true| / true = {worst:.1%} (target <= 10%); worst first "
          f"|estimate - true| / true = {worst_estimate:.1%} (target <= 25%)")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
