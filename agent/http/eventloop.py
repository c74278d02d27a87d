"""Running a server: its main coroutine on the fastest event loop, its HTTP listener
(with bounded connections, ``agent.http.connections``), and its header read timeout
(``handler_args``; the body's is in ``agent.http.body``)."""

from __future__ import annotations

import asyncio
import errno
import gc
import os
from collections.abc import Coroutine
from typing import Any

from agent.http.coalescing import coalescing_loop_factory
from agent.http.connections import Connections, limited_site


def run_event_loop(main: Coroutine[Any, Any, Any], *, poll_interval_s: float = 0.0) -> Any:
    """Run ``main`` on uvloop when it is installed, else on asyncio's default loop.

    ``EDGEAGENT_EVENT_LOOP=asyncio`` forces the default loop (for comparisons and
    debugging). ``poll_interval_s`` > 0: on asyncio's loop with a
    ``coalescing.CoalescingSelector`` (uvloop has no selector to wrap).
    """
    if poll_interval_s > 0:
        with asyncio.Runner(loop_factory=coalescing_loop_factory(poll_interval_s)) as runner:
            return runner.run(main)
    if os.environ.get("EDGEAGENT_EVENT_LOOP", "auto") != "asyncio":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.run(main)
    return asyncio.run(main)


async def listen(app: Any, host: str, port: int, connections: Connections, *,
                 backlog: int = 128, reuse_port: bool = False, ssl_context: Any = None,
                 front: Any = None, **runner_kwargs: Any) -> tuple[Any, str]:
    """Serve the aiohttp ``app`` on ``host:port`` (0: any free port); (runner, its URL).
    ``connections``: the bounds on open connections and the TLS handshake's deadline
    (``agent.http.connections``). ``backlog``: connections waiting to be accepted (a fleet
    reconnecting at once needs more than the default; the kernel caps it at
    net.core.somaxconn). ``reuse_port``: other processes of this user may listen on the
    same port (``SO_REUSEPORT``; the kernel spreads connections over them).
    ``ssl_context``: HTTPS (``agent.security.tls``). ``front``: a protocol in front of
    aiohttp's on each connection (``limited_site``'s)."""
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None, **runner_kwargs)
    await runner.setup()
    site = limited_site(runner, host, port, connections, ssl_context=ssl_context,
                        backlog=backlog, reuse_port=reuse_port, front=front)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        failure = OSError(bind_failure(host, port, exc, "--port"))
        failure.errno = exc.errno
        raise failure from None
    bound = site._server.sockets[0].getsockname()[1] if site._server else port
    return runner, f"{'https' if ssl_context else 'http'}://{host}:{bound}"


def bind_failure(host: str, port: int, exc: OSError, flag: str) -> str:
    """Why ``host:port`` cannot be listened on, and what to do: a port in use names how
    to find who holds it and the ``flag`` that picks another."""
    if exc.errno == errno.EADDRINUSE:
        return (f"port {port} on {host} is in use: another process listens there (`ss "
                f"-ltnp 'sport = :{port}'` names it); stop it, or choose another port with "
                f"{flag} (make run: PORT=8010 GRPC_PORT=8011)")
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"cannot listen on {host}:{port}: {host} is no address of this machine"
    if exc.errno == errno.EACCES:
        return (f"cannot listen on {host}:{port}: permission denied (ports below 1024 "
                "need privileges)")
    return f"cannot listen on {host}:{port}: {exc.strerror or exc}"


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


def handler_args(read_timeout_s: float) -> dict[str, Any]:
    """``web.Application(handler_args=...)`` of every server: a header read timeout of
    ``read_timeout_s`` (aiohttp closes a connection whose next request's headers have
    not all arrived that long after it opened or after its last answer: its keep-alive
    timer, which partial headers do not reset; an idle keep-alive connection closes
    after as long). After an answer to a request whose body was not all read (a 408, a
    413), aiohttp drains the rest for at most as long (its lingering time, 10 s by
    default) before it closes the connection. Bodies reach the handlers as they came
    (``auto_decompress`` off): ``agent.http.body`` decodes a ``Content-Encoding`` itself,
    in bounded steps counted against the limits."""
    return {"keepalive_timeout": read_timeout_s, "lingering_time": min(read_timeout_s, 10.0),
            "auto_decompress": False}
