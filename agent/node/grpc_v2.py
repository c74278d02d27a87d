"""The Open Inference Protocol (KServe v2) over gRPC: ``inference.GRPCInferenceService``
(``agent/node/protos/grpc_predict_v2.proto``), as ``tritonclient.grpc`` speaks it.

``start_grpc(node, host, port)`` serves it with ``grpc.aio`` on the running event loop,
the one the HTTP app runs on (``edgeagent serve`` starts it beside the HTTP listener).
Every RPC answers from the same ``Node`` as the HTTP routes: ``ModelInfer`` builds a
``Call`` and hands it to the front desk (``FrontDesk.infer``: a model through the cache
and batching, or a selection app) exactly as ``api_v2.infer`` does, its deadline the
sooner of the ``timeout`` parameter and the client's gRPC deadline; metadata, readiness
and the repository extension ask the same servable, Triton's configuration and
statistics use the same documents as ``api_triton``.

Errors: an ``AgentError`` answers with the status code ``agent.errors.grpc_code`` maps
its HTTP status to (503 UNAVAILABLE, 507 RESOURCE_EXHAUSTED, 400 INVALID_ARGUMENT,
404 NOT_FOUND, ...), its message as the details, and ``retry-after`` (whole seconds)
in the trailing metadata when it carries one; anything else is INTERNAL, logged.
With tokens, each RPC needs what its HTTP route needs (``agent.node.access``)
as ``authorization: Bearer <token>`` metadata: no or an unknown token answers
UNAUTHENTICATED, a token without the scope PERMISSION_DENIED, a throttled peer
RESOURCE_EXHAUSTED. ``ModelStreamInfer`` answers
UNIMPLEMENTED.

Memory: ``ModelInfer`` receives its message itself (``ReceiveInferItself``), once
``max_request_bytes_in_flight`` has room promised for what grpcio holds while it hands
the message over (``Receptions``: its largest size, and the two further copies of a
hand-off once for all the calls receiving), and reads ``raw_input_contents`` as views
of the received bytes (``split_infer_request``), not protobuf's copies. Connections:
at most ``max_connections`` (its own, beside HTTP's; past them grpc core refuses the
newcomer), each handshake within ``read_timeout_s``, and GOAWAY after as long idle.

Tensors (``agent.node.grpc_tensors``): an input comes either in ``raw_input_contents``
(one entry per input, in order: little-endian values, BYTES as 4-byte length + bytes per
element, the layout of the HTTP binary extension) or in its typed ``contents``; outputs
always go back in ``raw_output_contents``, as Triton answers.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import TYPE_CHECKING, Any, Callable

import grpc
from google.protobuf import json_format

from agent.errors import AgentError, grpc_code, http_status, retry_after_seconds
from agent.http.connections import connection_limits
from agent.http.eventloop import bind_failure
from agent.http.body import BodyMemory
from agent.memory import malloc_trim
from agent.node.access import endpoint_need
from agent.node import api_triton, api_v2
from agent.node.cache import UnknownModel
from agent.node.batching import rows_of
from agent.node.call import (V2_GRPC, Call, Decoded, Target, is_timeout, sooner,
                             timeout_parameter)
from agent.node.hostpaths import public_message
from agent.node.offload import forget_frames
from agent.node.protos import grpc_predict_v2_pb2 as pb
from agent.node.protos import grpc_predict_v2_pb2_grpc as pb_grpc
from agent.node.grpc_tensors import (decode_infer_request, encode_infer_response,
                                     parameters_of, split_infer_request)
from agent.node.routing.trust import SERVED_BY, grpc_mark
from agent.node.tensors import BadRequest
from agent.security.tls import ServerTls
from agent.validation import ascii_int

if TYPE_CHECKING:
    from agent.node.node import Node

log = logging.getLogger("edgeagent.grpc")


class GrpcInputs(Decoded):
    """A ``ModelInferRequest``'s tensors (``request`` parsed, ``raw`` its raw input
    contents as views of the message), decoded where the call is served here."""

    def __init__(self, request: Any, raw: Any) -> None:
        self.request, self.raw = request, raw
        self.tensors, self.rows = {}, 1
        self.meta: dict[str, Any] = {}  # the request's fields but its tensors

    async def read(self, call: Call, target: Target) -> None:
        """Decode; the call's deadline is the sooner of its ``timeout`` parameter and
        the client's gRPC deadline."""
        self.tensors, self.meta = decode_infer_request(self.request, target.limits(),
                                                       self.raw)
        self.rows = rows_of(self.tensors)
        call.parameters, call.request_id = self.meta["parameters"], self.meta["id"] or None
        call.timeout = sooner(timeout_parameter(call.parameters), call.timeout)

    def said_timeout(self) -> float | None:
        """The ``timeout`` parameter (microseconds) as the parsed request says it."""
        parameters = self.request.parameters
        param = parameters["timeout"] if "timeout" in parameters else None
        kind = param.WhichOneof("parameter_choice") if param is not None else None
        if kind not in ("int64_param", "uint64_param", "double_param"):
            return None
        raw = getattr(param, kind)
        return raw / 1e6 if is_timeout(raw) else None


def _version(raw: str, name: str) -> int | None:
    """The version a request names ("" for the default)."""
    if raw == "":
        return None
    try:
        return ascii_int(raw, "version")
    except ValueError:
        raise BadRequest(f"model {name!r} has no version {raw!r}: versions are integers "
                         "(ASCII digits)") from None


# -- the service ---------------------------------------------------------------------------


class NoRoomForMessage(AgentError):
    """No room in ``max_request_bytes_in_flight`` for a ModelInfer message within
    ``read_timeout_s``: RESOURCE_EXHAUSTED with retry-after (the message is never
    received)."""

    status = 429
    retry_after = 1.0


class MessageTooSlow(AgentError):
    """A ModelInfer message that did not arrive within ``read_timeout_s`` of its room
    (as an HTTP body that does not: 408, gRPC DEADLINE_EXCEEDED)."""

    status = 408


#: How many times over grpcio holds a message at the moment it hands it to Python:
#: grpc core's slices (as the message arrived), the ``bytearray`` that grpcio's
#: ``ReceiveMessageOperation.un_c`` (``_cygrpc/operation.pyx.pxi``) joins them into,
#: and the ``bytes`` it makes of that; the first two are freed before the message
#: reaches the handler. Measured with the RSS sampled every 0.5 ms (grpcio 1.85).
HANDOFF_COPIES = 3

#: A ModelInfer message this large is followed by a ``malloc_trim``.
TRIM_AFTER_BYTES = 4 * 2**20


class Receptions:
    """The room ModelInfer messages are received in, promised in
    ``max_request_bytes_in_flight`` before a byte of them arrives
    (``BodyMemory.reserve_aside``): grpcio receives a message whole before Python sees
    any of it, and its size is not known until then.

    A call waiting for its message promises ``max_request_size`` (grpc core's copy of
    it, as it arrives). The further ``HANDOFF_COPIES - 1`` copies exist only while
    ``un_c`` hands a message over, on the event loop, so one message at a time: they
    are promised once for all the calls waiting together, by the first, and given back
    when none waits. Promises are made one call at a time, in arrival order, and take
    at most ``share``: the limit less ``max_request_size`` (at least half of it), so
    HTTP bodies always keep the rest. A call that never sends its message holds its
    promise for ``read_timeout_s`` at most and keeps other gRPC messages waiting, never
    HTTP bodies. A message received is counted at its own size until ``done``. Where
    the share is under ``HANDOFF_COPIES x max_request_size`` (a limit under 4 x
    max_request_size) a message's hand-off is counted at the share, less than it may
    hold."""

    def __init__(self, memory: BodyMemory) -> None:
        self.memory = memory
        self.waiting = 0  # calls with room promised, waiting for their message
        self._handoff = 0  # the hand-off's copies, promised while a call waits
        self._turn = asyncio.Lock()
        self._trimming: asyncio.Future | None = None

    def rooms(self, max_request_size: int) -> tuple[int, int, int]:
        """(the share, a call's own room, the hand-off's room)."""
        limit = self.memory.limit_bytes
        share = max(limit - max_request_size, limit // 2)
        own = min(max_request_size, share)
        return share, own, min((HANDOFF_COPIES - 1) * max_request_size, share - own)

    async def receive(self, context: grpc.aio.ServicerContext, max_request_size: int,
                      timeout: float) -> bytes:
        """The call's one message, received once its room is promised (waiting up to
        ``timeout``: else ``NoRoomForMessage``), within ``timeout`` of that (else
        ``MessageTooSlow``); it stays counted at its own size until ``done``."""
        share, own, handoff = self.rooms(max_request_size)
        memory = self.memory
        try:
            async with asyncio.timeout(timeout), self._turn:
                if not self._handoff:
                    await memory.reserve_aside(handoff, share)
                    self._handoff = handoff
                await memory.reserve_aside(own, share)
                self.waiting += 1
        except BaseException as exc:  # no room in time, or the call went away
            self._settle()
            if not isinstance(exc, TimeoutError):
                raise
            raise NoRoomForMessage(
                f"no memory to receive the request's message within {timeout:g} s: "
                f"receiving it takes {own + handoff} bytes ({HANDOFF_COPIES} x "
                f"max_request_size, what grpcio holds while handing it over, at most "
                f"{share}: the limit less max_request_size), {memory.in_flight_bytes} "
                f"bytes are in flight, the limit is {memory.limit_bytes} "
                "(max_request_bytes_in_flight)") from None
        message = None
        try:
            if self._trimming is not None:  # the last large message's heap goes back first
                await asyncio.shield(self._trimming)
            async with asyncio.timeout(timeout):
                message = await context.read()
        except TimeoutError:
            raise MessageTooSlow(f"the request's message did not arrive within "
                                 f"{timeout:g} s (read_timeout_s)") from None
        finally:
            self.waiting -= 1
            arrived = len(message) if isinstance(message, bytes) else 0
            memory.release_aside(own, keep=arrived)
            self._settle()
        if message is grpc.aio.EOF:
            raise BadRequest("the call ended without a message")
        return message

    def done(self, message_bytes: int) -> None:
        """A message ``receive`` returned is answered: its bytes are free. After one of
        ``TRIM_AFTER_BYTES`` or more, free heap goes back to the OS (``malloc_trim``,
        off the event loop, one at a time, before the next message is read): gRPC
        receives a message in pieces from many threads' heaps, which glibc keeps once
        freed (tens of MiB)."""
        self.memory.release(message_bytes)
        if message_bytes >= TRIM_AFTER_BYTES and (self._trimming is None
                                                  or self._trimming.done()):
            self._trimming = asyncio.ensure_future(asyncio.to_thread(malloc_trim))

    def _settle(self) -> None:
        """Give the hand-off's room back once no call waits for a message or for
        room."""
        if self._handoff and not self.waiting and not self._turn.locked():
            self.memory.release_aside(self._handoff)
            self._handoff = 0

#: ``ModelInfer``'s method name as gRPC calls it.
INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"


class ReceiveInferItself(grpc.aio.ServerInterceptor):
    """Serve ``ModelInfer`` as a call that receives its one message itself, as bytes:
    its handler makes room for the message in ``max_request_bytes_in_flight`` before
    gRPC receives it (grpc's own unary handling receives first, so that a thousand
    strangers' messages would be held before any is counted)."""

    async def intercept_service(self, continuation: Callable, details: Any) -> Any:
        handler = await continuation(details)
        if details.method != INFER_METHOD or handler is None:
            return handler
        serialize = handler.response_serializer

        def response_serializer(response: Any) -> bytes:  # a peer's answer: bytes already
            return response if isinstance(response, bytes) else serialize(response)

        return grpc.stream_unary_rpc_method_handler(
            handler.unary_unary, request_deserializer=None,
            response_serializer=response_serializer)



async def _abort(context: grpc.aio.ServicerContext, exc: Exception, node: Node) -> None:
    """Answer ``exc`` as its gRPC status (see the module docstring), with no host path
    (``agent.node.hostpaths``)."""
    if isinstance(exc, AgentError):
        trailing: tuple[tuple[str, str], ...] = ()
        if exc.retry_after is not None:
            trailing = (("retry-after", str(retry_after_seconds(exc.retry_after))),)
        await context.abort(grpc.StatusCode[grpc_code(exc)],
                            public_message(node, exc.public or str(exc)),
                            trailing_metadata=trailing)
    log.error("unhandled error in a gRPC call", exc_info=exc)
    await context.abort(grpc.StatusCode.INTERNAL, "internal error (logged)")


def _rpc(method: Callable) -> Callable:
    """Wrap an RPC handler: its errors answer through ``_abort``."""
    @functools.wraps(method)
    async def handler(self: InferenceService, request: Any,
                      context: grpc.aio.ServicerContext) -> Any:
        try:
            return await method(self, request, context)
        except (grpc.aio.AbortError, asyncio.CancelledError):
            raise
        except Exception as exc:  # noqa: BLE001 - every error answers a status
            # the abort's own error chains this one, whose frames hold the request
            await _abort(context, forget_frames(exc), self.node)
        finally:  # gRPC keeps the abort's error (and its frames) in a reference cycle
            request = None
    return handler


#: A refusal's HTTP status as a gRPC status code.
_AUTH_CODES = {401: grpc.StatusCode.UNAUTHENTICATED, 403: grpc.StatusCode.PERMISSION_DENIED,
               429: grpc.StatusCode.RESOURCE_EXHAUSTED}


class InferenceService(pb_grpc.GRPCInferenceServiceServicer):
    """``inference.GRPCInferenceService`` over one ``Node``."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self._receptions = Receptions(node.body_memory)

    async def _check(self, context: grpc.aio.ServicerContext, path: str) -> None:
        """Abort unless the caller's token meets what HTTP ``path`` needs."""
        guard = self.node.guard
        need = endpoint_need("POST", path, self.node.config.auth.protect)
        if need is None or not guard.checks():
            return
        given = dict(context.invocation_metadata() or ()).get("authorization", "")
        peer = context.peer() or "unknown"  # ipv4:127.0.0.1:5000: the address, no port
        verdict = guard.authorize(given, need, peer=peer.rsplit(":", 1)[0])
        if verdict.status != 200:
            if verdict.retry_after:
                context.set_trailing_metadata((("retry-after", str(verdict.retry_after)),))
            await context.abort(_AUTH_CODES[verdict.status], verdict.message)

    @_rpc
    async def ServerLive(self, request: Any, context: Any) -> Any:
        return pb.ServerLiveResponse(live=True)

    @_rpc
    async def ServerReady(self, request: Any, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=self.node.ready)

    @_rpc
    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        doc = api_v2.server_metadata_doc()
        return pb.ServerMetadataResponse(**doc)

    @_rpc
    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        await self._check(context, "/v2/models/m")
        doc = await self.node.desk.servable(
            request.name, _version(request.version, request.name)).metadata()

        def tensors(specs: list[dict[str, Any]]) -> list[Any]:
            return [pb.ModelMetadataResponse.TensorMetadata(**s) for s in specs]

        return pb.ModelMetadataResponse(
            name=doc["name"], versions=doc["versions"], platform=doc["platform"],
            inputs=tensors(doc["inputs"]), outputs=tensors(doc["outputs"]))

    @_rpc
    async def ModelReady(self, request: Any, context: Any) -> Any:
        await self._check(context, "/v2/models/m/ready")
        servable = self.node.desk.servable(request.name,
                                           _version(request.version, request.name))
        return pb.ModelReadyResponse(ready=servable.unready() is None)

    @_rpc
    async def ModelConfig(self, request: Any, context: Any) -> Any:
        await self._check(context, "/v2/models/m/config")
        doc = await api_triton.model_config_doc(self.node, request.name,
                                                _version(request.version, request.name))
        response = pb.ModelConfigResponse()
        json_format.ParseDict(doc, response.config)
        return response

    @_rpc
    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        await self._check(context, "/v2/models/m/stats")
        name = request.name or None  # "": every model
        version = _version(request.version, request.name) if name else None
        response = pb.ModelStatisticsResponse()
        json_format.ParseDict(api_triton.model_stats_doc(self.node, name, version), response)
        return response

    @_rpc
    async def ModelInfer(self, requests: Any, context: Any) -> Any:
        """Served through ``ReceiveInferItself``: ``requests`` is the call's stream."""
        await self._check(context, "/v2/models/m/infer")
        node = self.node
        started = time.perf_counter()
        name, code = "<unknown>", 500
        counted = [0]  # the bytes counted in flight for the message (node.body_memory)
        trace = None if node.tracing is None else node.tracing.request(  # tracing
            dict(context.invocation_metadata() or ()), "", V2_GRPC)
        try:
            message = await self._receptions.receive(
                context, node.config.max_request_size, node.config.read_timeout_s)
            counted[0] = len(message)
            request, raw = split_infer_request(message)
            name = request.model_name
            # every answer names the node that served it: this one, unless relayed
            context.set_trailing_metadata(((SERVED_BY, node.router.name),))
            inputs = GrpcInputs(request, raw)
            remaining = context.time_remaining()  # the client's deadline, if it set one
            call = Call(name, _version(request.model_version, name), V2_GRPC,
                        node.serving.clock(), inputs,
                        timeout=None if remaining is None else max(remaining, 1e-6),
                        body=message, mark=grpc_mark(context, dict(
                            context.invocation_metadata() or ())))
            answer = await node.desk.infer(call)
            code = 200
            if answer.relayed is not None:
                context.set_trailing_metadata(((SERVED_BY, answer.served_by or ""),))
                return answer.relayed.body
            meta = inputs.meta
            return encode_infer_response(name, answer.version, answer.outputs,
                                         {**meta, "id": answer.request_id or meta["id"]},
                                         answer.parameters)
        except asyncio.CancelledError:  # the client cancelled or its deadline passed
            code = 499
            raise
        except BaseException as exc:
            code = http_status(exc)
            raise
        finally:
            self._receptions.done(counted[0])
            node.desk.count(name, V2_GRPC, code,
                            time.perf_counter() - started if code == 200 else None)
            if trace is not None:  # tracing
                trace.end(code, name)

    async def ModelStreamInfer(self, request_iterator: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                            "ModelStreamInfer (streaming inference) is not implemented by "
                            "edgeagent: send each request with ModelInfer")

    @_rpc
    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        await self._check(context, "/v2/repository")
        self._check_repository(request.repository_name)
        items = api_v2.repository_index_items(self.node, request.ready)
        return pb.RepositoryIndexResponse(
            models=[pb.RepositoryIndexResponse.ModelIndex(**item) for item in items])

    @_rpc
    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        await self._check(context, "/v2/repository")
        self._check_repository(request.repository_name)
        await api_v2.load_with_parameters(
            self.node, request.model_name, parameters_of(request.parameters, "parameter"))
        return pb.RepositoryModelLoadResponse()

    @_rpc
    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        await self._check(context, "/v2/repository")
        self._check_repository(request.repository_name)
        params = parameters_of(request.parameters, "parameter")
        unknown = set(params) - {"unload_dependents"}  # the agent has no dependents
        if unknown:
            raise BadRequest(f"unknown unload parameter(s) {', '.join(sorted(unknown))}")
        await self.node.desk.servable(request.model_name).unload()
        return pb.RepositoryModelUnloadResponse()

    def _check_repository(self, name: str) -> None:
        if name:
            raise UnknownModel(f"unknown repository {name!r}: the agent serves one, "
                               "named by an empty repository_name")


# -- the server ------------------------------------------------------------------------------


class GrpcServer:
    """A started gRPC server: its ``port`` (the bound one, for port 0) and ``stop``."""

    def __init__(self, server: grpc.aio.Server, host: str, port: int) -> None:
        self.server = server
        self.port = port
        self.address = f"{_host(host)}:{port}"

    async def stop(self, grace: float | None) -> None:
        """Refuse new calls, give those in flight ``grace`` seconds, then cancel them."""
        await self.server.stop(grace)


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _why_not(host: str, port: int) -> str:
    """Why ``host:port`` cannot be bound, in ``agent.http.eventloop.bind_failure``'s words."""
    import socket

    try:
        with socket.create_server((host, port)):
            pass
    except OSError as exc:
        return bind_failure(host, port, exc, "--grpc-port")
    return f"cannot listen on {host}:{port} (address in use or not available)"


async def start_grpc(node: Node, host: str, port: int,
                     tls: ServerTls | None = None) -> GrpcServer:
    """Serve ``inference.GRPCInferenceService`` for ``node`` on ``host:port`` (0: any free
    port) on the running event loop, over ``tls`` when given (its reloads reach new
    connections). OSError when the address cannot be bound (never shared: SO_REUSEPORT
    is off, so a second agent on the same port fails to start). At most
    ``grpc_max_concurrent_rpcs`` calls are served at once (more: RESOURCE_EXHAUSTED)."""
    server = grpc.aio.server(maximum_concurrent_rpcs=node.config.grpc_max_concurrent_rpcs,
                             interceptors=[ReceiveInferItself()],
                             options=[
                                 ("grpc.so_reuseport", 0),
                                 ("grpc.max_receive_message_length",
                                  node.config.max_request_size),
                                 ("grpc.max_send_message_length", -1),
                                 # a stream's window stays 64 KiB until its message is
                                 # read (not grown to the link's bandwidth-delay product)
                                 ("grpc.http2.bdp_probe", 0),
                                 # connections: as many as HTTP's, each handshake and
                                 # each idle spell (no call) within read_timeout_s
                                 ("grpc.max_allowed_incoming_connections", connection_limits(
                                     node.config.max_connections,
                                     node.config.max_connections_per_peer).total),
                                 ("grpc.server_handshake_timeout_ms",
                                  int(node.config.read_timeout_s * 1000)),
                                 ("grpc.max_connection_idle_ms",
                                  int(node.config.read_timeout_s * 1000))])
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceService(node), server)
    address = f"{_host(host)}:{port}"
    try:
        bound = server.add_secure_port(address, tls.grpc_credentials()) if tls \
            else server.add_insecure_port(address)
    except RuntimeError:  # "Failed to bind": a plain bind finds out why
        bound = 0
    if bound == 0:
        raise OSError(f"gRPC: {_why_not(host, port)} (--grpc-port 0: no gRPC endpoint)")
    await server.start()
    return GrpcServer(server, host, bound)
