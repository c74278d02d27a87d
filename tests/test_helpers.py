"""The test helpers other tests rely on for their isolation: ``reserved_port``."""

from __future__ import annotations

import asyncio
import errno
import socket

import pytest

from tests.helpers import reserved_port


def test_a_reserved_port_is_refused_to_others_and_taken_by_a_server():
    with reserved_port() as port:
        with socket.socket() as probe:  # nothing listens there
            assert probe.connect_ex(("127.0.0.1", port)) == errno.ECONNREFUSED
        with socket.socket() as other, pytest.raises(OSError) as err:
            other.bind(("127.0.0.1", port))  # a plain bind, as a port-0 search would see
        assert err.value.errno == errno.EADDRINUSE

        async def serve_once() -> bytes:
            server = await asyncio.start_server(  # asyncio sets SO_REUSEADDR, as aiohttp
                lambda r, w: (w.write(b"hi"), w.close()), "127.0.0.1", port)
            async with server:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                data = await reader.read()
                writer.close()
                return data
        assert asyncio.run(serve_once()) == b"hi"
