"""The servers' event loop choice: uvloop when installed, asyncio on request."""

import asyncio

import pytest

from agent.http.eventloop import run_event_loop


async def loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_uvloop_is_used_when_installed(monkeypatch):
    pytest.importorskip("uvloop", reason="uvloop is a dependency on Linux; absent here")
    monkeypatch.delenv("EDGEAGENT_EVENT_LOOP", raising=False)
    assert run_event_loop(loop_module()).startswith("uvloop")


def test_asyncio_loop_can_be_forced(monkeypatch):
    monkeypatch.setenv("EDGEAGENT_EVENT_LOOP", "asyncio")
    assert run_event_loop(loop_module()).startswith("asyncio")
