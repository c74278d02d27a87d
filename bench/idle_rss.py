"""Idle agent memory: ``edgeagent serve`` on the demo (what ``make run`` starts), once it
answers and before any request, as RSS, PSS and USS, with where the RSS goes (mappings
grouped by file, anonymous memory and heap) and the packages whose native code is mapped.

The demo pins its small classifier, so one model (~0.2 MiB) is loaded at start. Issue
14's target: <= 150 MB RSS. Reads /proc (Linux only).

    .venv/bin/python bench/idle_rss.py [--data-dir DIR] [--top 12]
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

MiB = 2**20
TARGET_MB = 150


def rollup(pid: int) -> dict[str, int]:
    """Rss, Pss and the private (USS) bytes of ``pid``, from smaps_rollup."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":", 1)
        fields[key] = int(value.split()[0]) * 1024
    return {"rss": fields["Rss"], "pss": fields["Pss"],
            "uss": fields["Private_Clean"] + fields["Private_Dirty"]}


def by_mapping(pid: int) -> collections.Counter:
    """RSS bytes per mapped file (``[anon]``, ``[heap]``, ... for the others)."""
    rss: collections.Counter = collections.Counter()
    current = "[anon]"
    header = re.compile(r"^[0-9a-f]+-[0-9a-f]+ ")
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        if header.match(line):
            parts = line.split(None, 5)
            current = parts[5].strip() if len(parts) > 5 else "[anon]"
        elif line.startswith("Rss:"):
            rss[current] += int(line.split()[1]) * 1024
    return rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="the agent's data dir [default: a fresh temporary one, so the "
                             "demo is generated first]")
    parser.add_argument("--top", type=int, default=12, help="mappings to list")
    parser.add_argument("--settle", type=float, default=2.0,
                        help="seconds to wait after the first answer")
    args = parser.parse_args()
    edgeagent = Path(sys.executable).with_name("edgeagent")
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = args.data_dir or Path(tmp) / "data"
        start = time.perf_counter()
        proc = subprocess.Popen([str(edgeagent), "serve", "--port", "0", "--data-dir",
                                 str(data_dir)], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
        try:
            url = next(line.split()[3] for line in proc.stdout
                       if line.startswith("edgeagent listening on"))
            while True:
                try:
                    urllib.request.urlopen(f"{url}/v2/health/ready", timeout=5).read()
                    break
                except OSError:
                    time.sleep(0.1)
            ready = time.perf_counter() - start
            time.sleep(args.settle)
            memory, mappings = rollup(proc.pid), by_mapping(proc.pid)
        finally:
            proc.terminate()
            proc.wait(30)
    print(f"edgeagent serve (demo) ready in {ready:.1f} s; idle: RSS {memory['rss'] / MiB:.0f} "
          f"MiB, PSS {memory['pss'] / MiB:.0f} MiB, USS {memory['uss'] / MiB:.0f} MiB "
          f"(target RSS <= {TARGET_MB} MB: "
          f"{'met' if memory['rss'] <= TARGET_MB * 1e6 else 'NOT met'})")
    print(f"\nRSS by mapping (top {args.top}):")
    for name, size in mappings.most_common(args.top):
        print(f"  {size / MiB:7.1f} MiB  {name.split('site-packages/')[-1]}")
    packages: collections.Counter = collections.Counter()
    for name, size in mappings.items():
        if "site-packages/" in name:
            packages[name.split("site-packages/")[1].split("/")[0]] += size
    print("\nRSS of native code and data per installed package:")
    print("  " + ", ".join(f"{p} {s / MiB:.1f}" for p, s in packages.most_common()))


if __name__ == "__main__":
    main()
