"""The request object every front end builds (``Call``: v2 REST, v2 gRPC, TF Serving
REST), its inputs as read against the signature of what serves it, and the ``Answer``
that comes back (``agent.node.frontdesk`` hands a call to what serves it).

A ``Call`` keeps what a forwarder needs to pass a request on to another node without
decoding or copying it again: the body as received with the headers that frame it, the
client's deadline, request id, parameters, the protocol it came in by and the caller.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

import numpy as np

from agent.backends.base import InvalidInput, TensorSpec, check_inputs
from agent.node.batching import rows_of


class Inputs(Protocol):
    """A request's input tensors, read against the signature of what serves it."""

    #: Its batch size where known before the model is loaded (the cold-start check), or 1.
    rows: int

    def against(self, signature: list[TensorSpec]) -> dict[str, np.ndarray]:
        """The tensors, checked against (or decoded with) ``signature``;
        ``InvalidInput`` (400) when they do not fit."""


class Decoded:
    """Inputs decoded before the model is known (v2 REST and gRPC): checked only."""

    def __init__(self, tensors: dict[str, np.ndarray]) -> None:
        self.tensors = tensors
        self.rows = rows_of(tensors)

    def against(self, signature: list[TensorSpec]) -> dict[str, np.ndarray]:
        check_inputs(signature, self.tensors)
        return self.tensors


@dataclass
class Call:
    """One inference request, as every front end builds it."""

    model: str
    version: int | None
    protocol: str             # the endpoint label: one of ``agent.node.metrics.ENDPOINTS``
    arrived: float            # the serving clock when it arrived
    inputs: Inputs
    parameters: dict[str, Any] = field(default_factory=dict)
    request_id: str | None = None
    timeout: float | None = None   # seconds the client waits at most (parameter, deadline)
    #: The request as received, undecoded (None where the front end has no body to keep),
    #: and the headers that frame it (``Content-Type``, ``Inference-Header-Content-Length``).
    body: bytes | memoryview | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    identity: str | None = None    # who called: a token's or a certificate's name


@dataclass
class Answer:
    """What served a call: the outputs, the model and version that computed them, the
    request id, a selection app's response parameters (None for a model) and the node
    that served it (None: this one)."""

    outputs: dict[str, np.ndarray]
    model: str
    version: int
    request_id: str | None = None
    parameters: dict[str, Any] | None = None
    served_by: str | None = None


#: The largest ``timeout`` parameter (microseconds, about 11.6 days): beyond it a
#: deadline is no time value (``1e300`` overflows the event loop's timers).
MAX_TIMEOUT_US = 1e12


def timeout_parameter(parameters: dict[str, Any]) -> float | None:
    """The client's ``timeout`` request parameter, in microseconds as Triton's clients
    send it, as seconds (None when absent)."""
    raw = parameters.get("timeout")
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) \
            or not 0 < raw <= MAX_TIMEOUT_US:
        raise InvalidInput(f"parameter 'timeout' must be a number of microseconds > 0 and "
                           f"<= {MAX_TIMEOUT_US:.0e}, got {raw!r}")
    return raw / 1e6
