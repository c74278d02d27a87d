"""Running a server: its main coroutine on the fastest event loop, its HTTP listener, and
its header read timeout (``header_timeout_args``; the body's is in ``agent.http.body``)."""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import Coroutine
from typing import Any

from agent.errors import json_error


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


async def listen(app: Any, host: str, port: int, *, backlog: int = 128,
                 reuse_port: bool = False, ssl_context: Any = None,
                 **runner_kwargs: Any) -> tuple[Any, str]:
    """Serve the aiohttp ``app`` on ``host:port`` (0: any free port); (runner, its URL).
    ``backlog``: connections waiting to be accepted (a fleet reconnecting at once needs
    more than the default; the kernel caps it at net.core.somaxconn). ``reuse_port``:
    other processes of this user may listen on the same port (``SO_REUSEPORT``; the
    kernel spreads connections over them). ``ssl_context``: HTTPS (``agent.security.tls``)."""
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None, **runner_kwargs)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=backlog, reuse_port=reuse_port or None,
                       ssl_context=ssl_context)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1] if site._server else port
    return runner, f"{'https' if ssl_context else 'http'}://{host}:{bound}"


#: A busy server's garbage collector thresholds: a young collection after 50,000 net
#: new objects, not Python's 700. At thousands of requests a second the default
#: collects the young generation so often that every request in flight at that instant
#: (and, with the loop busy, requests queued) is promoted and counted towards a full
#: collection, which walks every keep-alive connection's objects while the event loop
#: stalls (docs/benchmarks.md, ``coordinator_scale.py``). Requests that leave little
#: behind (tuples of strings, bytes and numbers, which the collector stops tracking)
#: rarely reach this.
GC_THRESHOLDS = (50_000, 10, 10)


def settle_gc() -> None:
    """Call once a server has started: startup's garbage is collected, what it kept
    (modules, config, state) lives as long as the process, so no full collection walks
    it again (``freeze``: a full collection walks every object ONNX Runtime, gRPC and
    aiohttp left behind, which can take a request's whole SLO), and the young generation
    is collected at ``GC_THRESHOLDS``."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def header_timeout_args(seconds: float) -> dict[str, Any]:
    """``web.Application(handler_args=...)`` for a header read timeout of ``seconds``:
    aiohttp closes a connection whose next request's headers have not all arrived
    ``seconds`` after it opened or after its last answer (its keep-alive timer, which
    partial headers do not reset; an idle keep-alive connection closes after as long).
    After an answer to a request whose body was not all read (a 408, a 413), aiohttp
    drains the rest for at most as long (its lingering time, 10 s by default) before it
    closes the connection."""
    return {"keepalive_timeout": seconds, "lingering_time": min(seconds, 10.0)}
