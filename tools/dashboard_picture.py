"""Take the README's picture of the agent's dashboard (docs/dashboard.png) from the demo,
so that it shows what the demo shows now.

It starts ``edgeagent serve`` on the generated demo (a data directory of its own, as
``make run`` does), sends it a little traffic (the MLPs past the budget, so some load
and some are evicted; the selection app, with feedback that teaches it which member is
right; the synthetic model), waits for the what-if curve, opens the page in Debian's
headless Chromium (tests/browser.py) and screenshots it. Beside the picture it writes
docs/dashboard.json: what the page showed (its models, apps, panels) and the picture's
SHA-256, which tests/test_dashboard_picture.py checks against agent/modelzoo.py's demo.

    .venv/bin/python tools/dashboard_picture.py [--out docs/dashboard.png]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.modelzoo import DEMO_APP, DEMO_MLPS, classifier_weights  # noqa: E402
from tests.browser import Browser  # noqa: E402

#: The traffic, in order: (model, requests). Rounds over more MLPs than the 128 MB
#: budget holds: loads and evictions, which more memory would spare (the what-if).
ROUND = [("mlp-large", 2), ("mlp-wide", 2), ("mlp-small", 3), ("mlp-deep", 2),
         ("mlp-medium", 2)]
TRAFFIC = [*ROUND * 3, ("synthetic-sleepy", 5)]
APP_REQUESTS = 40
ROWS = 4


def call(url: str, body: dict | None = None, method: str | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method or ("POST" if data else "GET"),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


def infer_body(name: str, rows: list[list[float]]) -> dict:
    return {"inputs": [{"name": name, "datatype": "FP32", "shape": [len(rows), len(rows[0])],
                        "data": [v for row in rows for v in row]}]}


def send_traffic(url: str) -> None:
    """The MLPs and the synthetic model, then the app with the classifier's own data and
    its labels as feedback."""
    for model, n in TRAFFIC:
        width = DEMO_MLPS[model]["inputs"] if model in DEMO_MLPS else 2
        for i in range(n):
            call(f"{url}/v2/models/{model}/infer",
                 infer_body("X", [[(i + j) / 10 for j in range(width)]]))
    _, _, x, y = classifier_weights(features=8, classes=3, seed=0)
    for i in range(APP_REQUESTS):
        rows = slice(i * ROWS, (i + 1) * ROWS)
        answer = call(f"{url}/v2/models/{DEMO_APP}/infer", infer_body("X", x[rows].tolist()))
        call(f"{url}/v2/models/{DEMO_APP}/feedback",
             {"id": answer["id"], "labels": y[rows].tolist()})


def wait_for_curve(url: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        curve = call(f"{url}/v1/whatif")
        if curve["points"]:
            return curve
        if time.monotonic() > deadline:
            raise SystemExit(f"no what-if curve within {timeout} s: {curve}")
        time.sleep(1)


async def screenshot(url: str, out: Path, workdir: Path) -> dict:
    """The page's picture in ``out``; what it showed."""
    binary = Browser.find()
    if binary is None:
        raise SystemExit("no chromium on PATH (Debian: apt-get install chromium)")
    async with Browser(binary, workdir, width=1400, height=900) as browser:
        await browser.open(url + "/?refresh=1000")
        await browser.wait_for(
            "document.querySelectorAll('#models tbody tr[data-model]').length > 0 && "
            "document.querySelectorAll('#whatif circle').length > 0 && "
            f"!!document.querySelector('#selection [data-app=\"{DEMO_APP}\"]')", 60)
        await asyncio.sleep(1.5)  # one more refresh: every figure settled
        shown = await browser.evaluate("""({
            models: [...document.querySelectorAll('#models tbody tr[data-model]')]
                .map((r) => r.dataset.model),
            apps: [...document.querySelectorAll('#selection [data-app]')].map((a) => ({
                app: a.dataset.app,
                members: [...a.querySelectorAll('tr[data-member]')].map((r) => r.dataset.member)})),
            panels: [...document.querySelectorAll('main section h2')]
                .map((h) => h.firstChild.textContent.trim()),
            hidden: [...document.querySelectorAll('main section[hidden] h2')]
                .map((h) => h.firstChild.textContent.trim()),
            devices: [...document.querySelectorAll('#memory [data-device]')]
                .map((d) => d.dataset.device),
            whatif_series: [...new Set([...document.querySelectorAll('#whatif path[data-series]')]
                .map((p) => p.dataset.series))]})""")
        errors = [e for e in browser.errors if not e.startswith("network:")]
        if errors:
            raise SystemExit(f"the page had errors: {errors}")
        png = await browser.screenshot(out)
    return {**shown, "png_sha256": hashlib.sha256(png).hexdigest()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "dashboard.png")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="edgeagent-picture-") as tmp:
        proc = subprocess.Popen(
            [sys.executable, "-c", "from agent.cli import main; main()", "serve", "--port",
             "0", "--grpc-port", "0", "--data-dir", str(Path(tmp) / "data")],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            line = proc.stdout.readline()
            while line and "listening on" not in line:
                line = proc.stdout.readline()
            if "listening on" not in line:
                raise SystemExit(f"the demo agent did not start (exit {proc.wait()})")
            url = line.split("listening on ")[1].split()[0]
            send_traffic(url)
            wait_for_curve(url)
            shown = asyncio.run(screenshot(url, args.out, Path(tmp)))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    record = args.out.with_suffix(".json")
    record.write_text(json.dumps(shown, indent=1) + "\n")
    print(f"{args.out}: {', '.join(shown['panels'])}; models {', '.join(shown['models'])}")
    print(f"{record}: what it showed")


if __name__ == "__main__":
    main()
