"""What the cache answers when it cannot serve a request, the memory tier's and the disk
tier's (a pull): each error carries the HTTP status to answer with (``agent.errors`` maps
it to gRPC)."""

from __future__ import annotations

from agent.errors import AgentError


class CacheError(AgentError):
    """A request the cache cannot serve; ``status`` is the HTTP status to answer with."""


class UnknownModel(CacheError):
    status = 404


class ModelInvalid(CacheError):
    """The repository entry is broken (bad config.yaml, missing file)."""

    status = 400


class ModelTooLarge(CacheError):
    """The model can never fit in its device budget."""

    status = 507


class CacheBusy(CacheError):
    """No room now: what could be evicted is in use or pinned."""

    status = 503
    retry_after = 1.0


class ModelInUse(CacheError):
    status = 409


class NotListed(CacheError):
    """A sourced model whose versions are not known yet (its source not listed yet,
    or unreachable with no listing kept): 503 + Retry-After."""

    status = 503
    retry_after = 5.0


class Reloading(CacheError):
    """The model's runtime failed while running (``BackendCrashed``): it is unloaded
    once its requests in flight are done and loaded again by the next request; 503."""

    status = 503
    retry_after = 1.0


class LoadFailed(CacheError):
    """A load failed (a corrupt model file, a runtime that refuses it): 503, with
    ``Retry-After`` while the failure is remembered (``load_retry_s``)."""

    status = 503

    def __init__(self, message: str, retry_after: float | None = None,
                 status: int = 503):
        super().__init__(message)
        self.retry_after, self.status = retry_after, status


# -- the disk tier (``agent.node.cache.disktier``) -----------------------------------------


class PullError(AgentError):
    """A pull failed; ``status`` and ``retry_after`` are its cause's (a source's 503 is
    retryable, a wrong digest 502, a missing version 404)."""

    status = 503

    def __init__(self, message: str, status: int = 503,
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status, self.retry_after = status, retry_after


class NoDiskRoom(PullError):
    """The files can never fit: the disk, or the disk budget less what is pinned (507)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 507)


class DiskBusy(PullError):
    """A pull waited its model's ``load_wait_max_s`` for disk room that pulls and loads
    held (503 + Retry-After); nothing is remembered: the next request tries again."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 503, 1.0)


class NotSourced(AgentError):
    """``ensure``/``drop`` of a model the tier pulls nothing for (404)."""

    status = 404
