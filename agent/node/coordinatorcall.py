"""One POST to the coordinator (a full report or a lease): its answer's bytes, or
``CoordinatorRefused`` saying what it answered instead and the ``Retry-After`` it asked
for."""

from __future__ import annotations

import time
from typing import Any

import aiohttp

from agent.backoff import parse_retry_after
from agent.validation import load_json


class CoordinatorRefused(RuntimeError):
    """The coordinator answered a report with an error (``status``); ``retry_after``:
    the seconds its ``Retry-After`` asked for (None without one)."""

    def __init__(self, message: str, retry_after: float | None, status: int = 0) -> None:
        super().__init__(message)
        self.retry_after, self.status = retry_after, status


async def post(session: aiohttp.ClientSession, url: str, body: dict[str, Any],
               token: str | None) -> bytes:
    """POST ``body`` (JSON, with ``token`` as its bearer) to ``url``; the answer's bytes
    where it is a 200, else ``CoordinatorRefused`` with the error it names."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with session.post(url, json=body, headers=headers) as resp:
        raw = await resp.read()
        if resp.status == 200:
            return raw
    try:
        answer = load_json(raw)
    except ValueError:
        answer = None
    message = answer.get("error") if isinstance(answer, dict) else resp.reason
    retry_after = parse_retry_after(resp.headers.get("Retry-After"), time.time()) \
        if resp.status in (429, 503) else None
    raise CoordinatorRefused(f"coordinator answered {resp.status}: {message}", retry_after,
                             resp.status)
