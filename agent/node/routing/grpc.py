"""Forwarding over gRPC: one ``grpc.aio`` channel per peer address (HTTP/2: one kept
connection carries every call), ``ModelInfer`` called with the message as it arrived
(bytes in, bytes out: never parsed or encoded again)."""

from __future__ import annotations

from typing import Any

import grpc

from agent.node.routing.http import PeerFailed

#: ``ModelInfer``'s method name as gRPC calls it.
INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"

#: Status codes of a peer's own answer (its request was bad, or the model unknown):
#: passed to the client as they are. Any other failure falls back to serving here.
PASSED = {grpc.StatusCode.INVALID_ARGUMENT: 400}
#: The peer answered but could not serve now (busy, no room): served here, peer kept.
BUSY = {grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE}


class GrpcFailed(Exception):
    """A peer's own error status (its ``code``, ``details`` and trailing metadata)."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing: tuple) -> None:
        super().__init__(details)
        self.code, self.details, self.trailing = code, details, trailing


class GrpcForwarder:
    """``ModelInfer`` on peers, a channel per address, made on first use."""

    def __init__(self, credentials: grpc.ChannelCredentials) -> None:
        """``credentials``: for peers that speak TLS (those with an https:// URL)."""
        self.credentials = credentials
        self._calls: dict[tuple[str, bool], tuple[grpc.aio.Channel, Any]] = {}

    def _call(self, address: str, tls: bool) -> Any:
        found = self._calls.get((address, tls))
        if found is None:
            options = [("grpc.max_send_message_length", -1),
                       ("grpc.max_receive_message_length", -1)]
            channel = grpc.aio.secure_channel(address, self.credentials, options) \
                if tls else grpc.aio.insecure_channel(address, options)
            found = self._calls[(address, tls)] = (channel, channel.unary_unary(INFER_METHOD))
        return found[1]

    async def infer(self, address: str, message: Any, metadata: list[tuple[str, str]],
                    timeout: float, *, tls: bool = False) -> tuple[bytes, tuple]:
        """(the peer's answer as bytes, its trailing metadata). ``GrpcFailed`` for an
        answer the peer gave (an error status after it received the call);
        ``PeerFailed`` when the call could not be made or took longer than
        ``timeout``."""
        call = self._call(address, tls)(message, metadata=metadata, timeout=timeout)
        try:
            answer = await call
            return answer, tuple(await call.trailing_metadata() or ())
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            trailing = tuple(exc.trailing_metadata() or ())
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise PeerFailed(f"no answer within {timeout:.3g} s", late=True) from None
            if code == grpc.StatusCode.UNAVAILABLE and not trailing:  # never reached it
                raise PeerFailed(f"unavailable: {exc.details()}") from None
            raise GrpcFailed(code, exc.details() or "", trailing) from None

    async def close(self) -> None:
        for channel, _ in self._calls.values():
            await channel.close()
        self._calls = {}
