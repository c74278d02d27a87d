"""The request object every front end builds (``Call``: v2 REST, v2 gRPC, TF Serving
REST), its inputs as read against what serves it, and the ``Answer`` that comes back
(``agent.node.frontdesk`` hands a call to what serves it).

A ``Call`` keeps what a forwarder needs to pass a request on to another node without
decoding or copying it: the body as received with the headers that frame it, the
client's deadline, request id, parameters, the protocol it came in by and its mark
(a call another node says it forwarded). Its inputs are read (decoded) only where it
is served: ``Call.read``, which the servable of this node calls first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Awaitable, Mapping, Protocol

import numpy as np

from agent.backends.base import InvalidInput, TensorSpec, check_inputs
from agent.node.batching import rows_of
from agent.node.tensors import Limits


#: The protocols a call comes in by (its endpoint label in ``/metrics``).
V2_REST, V2_GRPC, TF_REST = "v2", "v2-grpc", "tfserving-rest"


class Target(Protocol):
    """What a call's body is read for: the limits of one request and the signature
    where known without a load."""

    def limits(self) -> Limits: ...

    def signature(self) -> Awaitable[list[TensorSpec] | None]: ...


class Inputs(Protocol):
    """A request's input tensors, read against the signature of what serves it."""

    #: Its batch size where known before the model is loaded (the cold-start check), or 1.
    rows: int

    async def read(self, call: Call, target: Target) -> None:
        """Decode the body for ``target``, filling in what it says of the call (its
        parameters, request id and timeout); nothing where the tensors are decoded."""

    def said_timeout(self) -> float | None:
        """The client's timeout (seconds) as the unread body says it, read leniently
        for a call passed on: None where absent, malformed or not cheap to read."""

    def against(self, signature: list[TensorSpec]) -> dict[str, np.ndarray]:
        """The tensors, checked against (or decoded with) ``signature``;
        ``InvalidInput`` (400) when they do not fit."""


class Decoded:
    """Inputs decoded already (a selection app's member calls; tests): checked only."""

    def __init__(self, tensors: dict[str, np.ndarray]) -> None:
        self.tensors = tensors
        self.rows = rows_of(tensors)

    async def read(self, call: Call, target: Target) -> None:
        """Nothing to decode."""

    def said_timeout(self) -> float | None:
        return None

    def against(self, signature: list[TensorSpec]) -> dict[str, np.ndarray]:
        check_inputs(signature, self.tensors)
        return self.tensors


@dataclass(frozen=True)
class Mark:
    """A call marked as forwarded by a fleet node: the node it names and what shows it
    is one (its bearer credential, its verified certificate's name, its address),
    judged by routing's trust (``agent.node.routing.trust``)."""

    node: str
    authorization: str = ""
    certificate: str | None = None
    remote: str | None = None


@dataclass
class Call:
    """One inference request, as every front end builds it."""

    model: str
    version: int | None
    protocol: str             # ``V2_REST``, ``V2_GRPC`` or ``TF_REST``
    arrived: float            # the serving clock when it arrived
    inputs: Inputs
    parameters: dict[str, Any] = field(default_factory=dict)
    request_id: str | None = None
    #: Seconds the client waits at most: its deadline (gRPC's) when the call is built,
    #: the sooner of that and its ``timeout`` parameter once read.
    timeout: float | None = None
    #: The request as received, undecoded (None where the front end has no body to keep),
    #: and the headers it came with (a forwarder passes on those that frame the body:
    #: ``Content-Type``, ``Inference-Header-Content-Length``, ``X-Request-Id``).
    body: bytes | bytearray | memoryview | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    mark: Mark | None = None  # set: another node says it forwarded this call

    async def read(self, target: Target) -> None:
        """Read the inputs for ``target`` (this node serves the call)."""
        await self.inputs.read(self, target)

    def deadline(self) -> float | None:
        """The client's timeout as known without reading the body (a call passed on)."""
        return sooner(self.timeout, self.inputs.said_timeout())


@dataclass
class Answer:
    """What served a call: the outputs, the model and version that computed them, the
    request id, a selection app's response parameters (None for a model), the node that
    served it (None: this one) and, for an answer a peer gave, its bytes as they came
    (``relayed``: passed to the client without decoding)."""

    outputs: dict[str, np.ndarray]
    model: str
    version: int | None
    request_id: str | None = None
    parameters: dict[str, Any] | None = None
    served_by: str | None = None
    relayed: Relayed | None = None


@dataclass(frozen=True)
class Relayed:
    """A peer's answer as it came, in the call's protocol: its HTTP status, the headers
    that frame its body (``Content-Type``, ``Inference-Header-Content-Length``, ...)
    and the body (gRPC: the serialized ``ModelInferResponse``)."""

    status: int
    headers: dict[str, str]
    body: bytes


#: The largest ``timeout`` parameter (microseconds, about 11.6 days): beyond it a
#: deadline is no time value (``1e300`` overflows the event loop's timers).
MAX_TIMEOUT_US = 1e12


def timeout_parameter(parameters: dict[str, Any]) -> float | None:
    """The client's ``timeout`` request parameter, in microseconds as Triton's clients
    send it, as seconds (None when absent)."""
    raw = parameters.get("timeout")
    if raw is None:
        return None
    if not is_timeout(raw):
        raise InvalidInput(f"parameter 'timeout' must be a number of microseconds > 0 and "
                           f"<= {MAX_TIMEOUT_US:.0e}, got {raw!r}")
    return raw / 1e6


def is_timeout(raw: Any) -> bool:
    """Whether ``raw`` is a valid ``timeout`` parameter (microseconds)."""
    return not isinstance(raw, bool) and isinstance(raw, (int, float)) \
        and 0 < raw <= MAX_TIMEOUT_US


def sooner(a: float | None, b: float | None) -> float | None:
    """The sooner of two timeouts (None: none)."""
    return b if a is None else a if b is None else min(a, b)
