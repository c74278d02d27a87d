"""The `edgeagent` subcommands, one module per command group."""

from __future__ import annotations

import os
import shutil
import sys


def self_command() -> str:
    """How to run this CLI again from the same shell: ``edgeagent`` when that is on PATH,
    else the path of the script that ran (``.venv/bin/edgeagent`` from the checkout)."""
    script = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if os.path.basename(script) != "edgeagent":
        return "edgeagent"
    found = shutil.which("edgeagent")
    if found and os.path.realpath(found) == os.path.realpath(script):
        return "edgeagent"
    relative = os.path.relpath(script)
    return relative if not relative.startswith("..") else script
