"""Running a server: its main coroutine on the fastest event loop, its HTTP listener."""

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


async def listen(app: Any, host: str, port: int, **runner_kwargs: Any) -> tuple[Any, str]:
    """Serve the aiohttp ``app`` on ``host:port`` (0: any free port); (runner, its URL)."""
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None, **runner_kwargs)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1] if site._server else port
    return runner, f"http://{host}:{bound}"
