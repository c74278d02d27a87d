"""Running a server's main coroutine on the fastest event loop available."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any


def run_event_loop(main: Coroutine[Any, Any, Any]) -> Any:
    """Run ``main`` on uvloop when it is installed, else on asyncio's default loop.

    ``EDGEAGENT_EVENT_LOOP=asyncio`` forces the default loop (for comparisons and
    debugging).
    """
    if os.environ.get("EDGEAGENT_EVENT_LOOP", "auto") != "asyncio":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.run(main)
    return asyncio.run(main)
