"""Which scope each of the agent's endpoints needs once it has tokens (HTTP routes and
the gRPC RPCs alike: an RPC needs what its HTTP route needs)."""

from __future__ import annotations

from agent.security.httpauth import Need

_READ_ONLY = ("GET", "HEAD")
_ADMIN, _READ, _INFER = Need("admin"), Need("read"), Need("infer")


def endpoint_need(method: str, path: str, protect: tuple[str, ...]) -> Need | None:
    """What a request to the agent needs once it has tokens: admin for the repository,
    cache changes, selection apps' contexts and changes and the twin's record (the node's
    traffic), read for the cache, memory, disk tier, the selection apps' list (weights and
    confidence, no contexts: the dashboard's), configs, the what-if curve and the
    coordinator link; /metrics and statistics (read) and inference (infer) only when
    ``protect`` names their group; health, server metadata and the dashboard's files
    never (None)."""
    if path == "/v1/selection" and method in _READ_ONLY:
        return _READ
    if path.startswith(("/v2/repository", "/v1/selection")) or (
            path.startswith("/v1/cache") and method not in _READ_ONLY) \
            or path in ("/v1/trace", "/v1/profiles"):
        return _ADMIN
    if path.startswith("/v1/cache") or path in ("/v1/memory", "/v1/disk", "/v1/coordinator",
                                                "/v1/whatif", "/v1/routing") \
            or path.endswith("/config"):
        return _READ
    if path == "/metrics" or path.endswith("/stats"):
        return _READ if "read" in protect else None
    if path in ("/", "/v2") or path.startswith(("/v2/health/", "/static/")):
        return None
    return _INFER if "infer" in protect else None
