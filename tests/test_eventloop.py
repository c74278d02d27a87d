"""The servers' event loop choice: uvloop when installed, asyncio on request."""

import asyncio

import pytest

from agent.http.coalescing import CoalescingSelector
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


async def selector_interval() -> float | None:
    selector = getattr(asyncio.get_running_loop(), "_selector", None)
    return selector.interval_s if isinstance(selector, CoalescingSelector) else None


def test_a_poll_interval_runs_on_asyncio_with_the_coalescing_selector(monkeypatch):
    monkeypatch.delenv("EDGEAGENT_EVENT_LOOP", raising=False)
    assert run_event_loop(selector_interval(), poll_interval_s=0.002) == 0.002
    assert run_event_loop(selector_interval(), poll_interval_s=0.0) is None
