"""Forwarding over HTTP: one aiohttp session, its connections kept alive per peer
(``routing.connections_per_peer``), the body passed on as the bytes that arrived (never
decoded, never copied again) and the answer's body returned as it came."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

import aiohttp

#: The answer headers a forwarded answer keeps (the rest are the peer's framing).
KEPT_HEADERS = ("Content-Type", "Inference-Header-Content-Length", "Retry-After")


class PeerFailed(Exception):
    """A forward that got no usable answer: the peer refused or dropped the connection,
    did not take it in time, or did not answer within the time it had (``late``)."""

    def __init__(self, why: str, *, late: bool = False) -> None:
        super().__init__(why)
        self.late = late


class HttpForwarder:
    """POSTs to peers over kept-alive connections; ``start`` on the event loop."""

    def __init__(self, connections_per_peer: int, ssl_context: ssl.SSLContext | None) -> None:
        self.connections_per_peer = connections_per_peer
        self.ssl_context = ssl_context
        self.session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=self.connections_per_peer,
                                         keepalive_timeout=30.0,
                                         ssl=self.ssl_context if self.ssl_context else True)
        self.session = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                             skip_auto_headers=("User-Agent",))

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def post(self, url: str, body: bytes | bytearray | memoryview, headers: dict[str, str], *,
                   connect_s: float, answer_s: float) -> tuple[int, dict[str, str], bytes]:
        """(status, the kept headers, body) of the peer's answer to ``body`` at ``url``;
        ``PeerFailed`` when it cannot be had: no connection within ``connect_s``, no
        whole answer within ``answer_s`` (``late``), or the connection failed."""
        assert self.session is not None, "start() first"
        timeout = aiohttp.ClientTimeout(total=answer_s, sock_connect=connect_s)
        try:
            async with self.session.post(url, data=body, headers=headers, timeout=timeout,
                                         allow_redirects=False) as answer:
                data = await answer.read()
                kept = {k: answer.headers[k] for k in KEPT_HEADERS if k in answer.headers}
                kept.update({k: v for k, v in answer.headers.items()
                             if k.lower().startswith("edgeagent-")})
                return answer.status, kept, data
        except aiohttp.ConnectionTimeoutError:
            raise PeerFailed(f"no connection within {connect_s:.3g} s") from None
        except asyncio.TimeoutError:
            raise PeerFailed(f"no answer within {answer_s:.3g} s", late=True) from None
        except (aiohttp.ClientError, OSError) as exc:
            raise PeerFailed(f"{type(exc).__name__}: {exc}") from None

    def describe(self) -> dict[str, Any]:
        connector = self.session.connector if self.session is not None else None
        return {"connections_per_peer": self.connections_per_peer,
                "tls": self.ssl_context is not None,
                "idle_connections": sum(len(v) for v in getattr(connector, "_conns", {})
                                        .values()) if connector is not None else 0}
