"""Where a report's CPU goes in a report worker, and what HTTP/2 or batching could save.

Three servers on uvloop, each in a process of its own, driven by ``--conns`` raw
kept-alive sockets from this process (the agent's 10-model report as the bench
``coordinator_scale.py`` sends it, prepared once), ``--requests`` reports each, in
``--rounds`` alternating rounds; the server's own CPU (user + system of its process)
per report:

* ``http only``: aiohttp answering every POST with a fixed body after reading it (the
  HTTP/1.1 layer: llhttp, the request object, the response, the transport);
* ``worker``: the report worker's own app (``agent.coordinator.reportworkers``: its
  middlewares, validation, the answer, the record handed over), without a plan;
* ``worker, raw lane``: the same app behind the worker's raw lane
  (``agent.http.rawlane``), which answers reports and leases below aiohttp's web layer,
  as a worker serves them;
* ``worker, h2 framing``: the worker's per-report work without HTTP, plus what the
  ``h2`` package (pure Python, the HTTP/2 stack an asyncio server would use) spends
  to receive one POST and send its answer on an open connection: HTTP/2's cost
  without its socket (a lower bound; it needs ``pip install h2``, else skipped).

Then, in this process, the report path's steps by themselves (validation, the answer,
the record) and a batch of ``--batch`` reports validated in one call (as one body
carrying several reports would be) against one at a time. The worker's two lines are
measured again with a lease (the node's first, ``{}``: validated and answered
``{"report": true}``) instead of a report.

    .venv/bin/python bench/report_cost.py [--requests 20000] [--conns 50] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.coordinator_scale import node_body  # noqa: E402

ANSWER = b'{"node":"node-1","plan_id":null,"ttl_s":60.0,"workers":{},"pin":[],' \
         b'"prefetch":[],"drop_rate":{}}'


def _http_only_app() -> Any:
    from aiohttp import web

    async def report(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=ANSWER, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/nodes/{name}/report", report)
    return app


def _worker_app() -> tuple[Any, Any]:
    """(The worker's app, its raw lanes)."""
    from agent.coordinator.config import CoordinatorConfig
    from agent.coordinator.reportworkers import _raw_lanes, _worker_app, _WorkerState

    config = CoordinatorConfig(port=0)
    state = _WorkerState(config, "http://127.0.0.1:9", "key")

    async def drain() -> None:  # the hand-over, without a coordinator to take it
        while True:
            await asyncio.sleep(0.25)
            state.answered = []

    app = _worker_app(config, state)
    app.on_startup.append(lambda app: _spawn(drain()))
    return app, _raw_lanes(config, state)


def _spawn(coro: Any) -> Any:
    async def start() -> None:
        asyncio.get_running_loop().create_task(coro)
    return start()


def serve(kind: str, conn: Any) -> None:
    """A server process: its port, then its CPU seconds at each ``"cpu"`` asked."""
    import uvloop
    from aiohttp import web

    from agent.http.eventloop import settle_gc

    async def main() -> None:
        app, lanes = (_http_only_app(), None) if kind == "http only" else _worker_app()
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        protocol = lanes.front(runner.server) if kind.endswith("raw lane") else runner.server
        server = await asyncio.get_running_loop().create_server(
            protocol, "127.0.0.1", 0, backlog=1024)
        settle_gc()  # as the coordinator and its workers do once they listen
        conn.send(server.sockets[0].getsockname()[1])
        loop = asyncio.get_running_loop()
        while True:
            message = await loop.run_in_executor(None, conn.recv)
            if message is None:
                break
            conn.send(time.process_time())
        server.close()
        await runner.cleanup()

    uvloop.run(main())


async def drive(port: int, request: bytes, conns: int, requests: int) -> None:
    """``requests`` reports over ``conns`` kept connections, one in flight on each."""
    per = requests // conns

    async def one() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.transport.get_extra_info("socket").setsockopt(
            socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(per):
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            at = head.lower().find(b"content-length:")
            length = int(head[at + 15:head.find(b"\r\n", at)])
            await reader.readexactly(length)
            assert head[9:12] == b"200", head
        writer.close()

    await asyncio.gather(*(one() for _ in range(conns)))


def measure_server(kind: str, request: bytes, args: argparse.Namespace) -> float:
    """The server's CPU per report (ms) over ``args.requests`` reports."""
    parent, child = mp.get_context("spawn").Pipe()
    proc = mp.get_context("spawn").Process(target=serve, args=(kind, child), daemon=True)
    proc.start()
    port = parent.recv()
    asyncio.run(drive(port, request, args.conns, 2 * args.conns))  # connections, warm
    parent.send("cpu")
    cpu0 = parent.recv()
    asyncio.run(drive(port, request, args.conns, args.requests))
    parent.send("cpu")
    cpu = parent.recv() - cpu0
    parent.send(None)
    proc.join(10)
    return cpu * 1000 / (args.requests // args.conns * args.conns)


def per_call_ms(fn: Any, n: int) -> float:
    fn()
    t = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - t) * 1000 / n


def steps(body: bytes, args: argparse.Namespace) -> dict[str, float]:
    """The report path's steps in this process, ms each."""
    from agent.coordinator.ingest import (Fleet, parse_report_body, report_record,
                                         reported_models)
    from agent.wire import parse_report

    report = parse_report_body("node-1", body)
    fleet = Fleet(60.0)
    n = 5000
    out = {
        "validate (agent.wire)": per_call_ms(lambda: parse_report_body("node-1", body), n),
        "the answer (Fleet.answer)": per_call_ms(lambda: fleet.answer("node-1", report), n),
        "the record (report_record, reported_models)": per_call_ms(
            lambda: (report_record("node-1", body, report, time.time()),
                     reported_models(report)), n)}
    batch = b"[" + b",".join([body] * args.batch) + b"]"
    import msgspec

    from agent.wire import NodeReport  # the Struct parse_report decodes into
    decoder = msgspec.json.Decoder(list[NodeReport])
    try:
        decoder.decode(batch)
        out[f"validate, {args.batch} in one body (per report)"] = per_call_ms(
            lambda: decoder.decode(batch), max(1, n // args.batch)) / args.batch
    except (msgspec.ValidationError, TypeError):
        pass
    out["validate, one at a time (msgspec alone)"] = per_call_ms(
        lambda: parse_report("node-1", body), n)
    return out


def h2_framing_ms(body: bytes, n: int) -> float | None:
    """What the ``h2`` package spends per POST received and answer sent on an open
    connection (the server's side), None without it."""
    try:
        import h2.config
        import h2.connection
        import h2.events
    except ImportError:
        return None
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    client.initiate_connection()
    server.initiate_connection()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    server.receive_data(client.data_to_send())
    headers = [(":method", "POST"), (":path", "/v1/nodes/node-1/report"),
               (":scheme", "http"), (":authority", "127.0.0.1"),
               ("content-type", "application/json"), ("content-length", str(len(body)))]

    spent = 0.0
    for i in range(n + 1):
        client.send_headers(1 + 2 * i, headers)  # the client's side is not counted
        client.send_data(1 + 2 * i, body, end_stream=True)
        raw = client.data_to_send()
        t = time.process_time()
        for event in server.receive_data(raw):
            if isinstance(event, h2.events.DataReceived):
                server.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                server.send_headers(event.stream_id, [(":status", "200"), (
                    "content-type", "application/json"), ("content-length", str(len(ANSWER)))])
                server.send_data(event.stream_id, ANSWER, end_stream=True)
        answer = server.data_to_send()
        if i:  # the first one warms the header tables
            spent += time.process_time() - t
        for event in client.receive_data(answer):  # it acknowledges the answer: its
            if isinstance(event, h2.events.DataReceived):  # window updates go with the
                client.acknowledge_received_data(  # next request
                    event.flow_controlled_length, event.stream_id)
    return spent * 1000 / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20000,
                        help="reports per server and round (default 20000)")
    parser.add_argument("--conns", type=int, default=50, help="kept connections (default 50)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--batch", type=int, default=50,
                        help="reports in one body for the batch line (default 50)")
    args = parser.parse_args()
    body = node_body(1, 10, 1000, 5.0)
    request = (f"POST /v1/nodes/node-1/report HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
               ).encode() + body
    print(f"report body {len(body)} bytes; {args.requests} reports over {args.conns} kept "
          f"connections per server and round; load average {os.getloadavg()[0]:.1f}")
    lease = (b"POST /v1/nodes/node-1/lease HTTP/1.1\r\nHost: 127.0.0.1\r\n"
             b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
    kinds = ("http only", "worker", "worker, raw lane")
    leases = ("worker: a lease", "worker, raw lane: a lease")
    seen: dict[str, list[float]] = {k: [] for k in kinds + leases}
    for _ in range(args.rounds):
        for kind in kinds:
            seen[kind].append(measure_server(kind, request, args))
        for kind in leases:
            seen[kind].append(measure_server(kind.split(":")[0], lease, args))
    framing = h2_framing_ms(body, 2000)
    own = steps(body, args)
    print(f"{'server CPU per report':<48} {'ms (median of rounds)':>22}")
    for kind in kinds + leases:
        print(f"{kind:<48} {sorted(seen[kind])[len(seen[kind]) // 2]:>22.3f}")
    http = sorted(seen["http only"])[args.rounds // 2]
    worker = sorted(seen["worker"])[args.rounds // 2]
    if framing is None:
        print(f"{'worker, h2 framing':<48} {'(pip install h2)':>22}")
    else:
        print(f"{'worker, h2 framing (no socket)':<48} {worker - http + framing:>22.3f}")
        print(f"{'  h2 framing alone, per POST and answer':<48} {framing:>22.3f}")
    print(f"{'the steps alone, in this process':<48} {'ms':>22}")
    for name, ms in own.items():
        print(f"{'  ' + name:<48} {ms:>22.3f}")
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
