"""The fleet as one cache, the node's side (issue 34): a call for a model that the
coordinator's plan runs on other nodes is forwarded to one of them, one hop at most,
and served here when no peer can. ``router.Router`` is what the front desk asks
(``peer_for``, ``forward``); the other modules are its parts: the table (``table``),
the choice of a peer and its health (``peers``), the forward itself (``forward``),
the marks and credentials between nodes (``trust``), the HTTP and gRPC clients
(``http``, ``grpc``) and the counts (``stats``)."""

from agent.node.routing.router import Router

__all__ = ["Router"]
