"""What can go wrong listing or pulling a model from a source, each with its HTTP
status: one base (``SourceError``, a bad URL or option) and the pull's failures.

Messages name the source by its ``display_url`` only: never a credential, a query
string or a signature.
"""

from __future__ import annotations

from agent.errors import AgentError


class SourceError(AgentError, ValueError):
    """A bad source URL or option (400), and the base of every source error."""

    status = 400


class SourceNotFound(SourceError):
    """No such bucket, prefix, repository, tag, file or version (404)."""

    status = 404


class DigestMismatch(SourceError):
    """A file's bytes do not match its digest or size: the partial pull is removed and
    nothing is renamed into place (502: the source served bad bytes)."""

    status = 502


class SourceUnavailable(SourceError):
    """The source could not be reached or answered 5xx, or the transfer was cut or timed
    out: retryable, and the partial pull is kept for the next pull to resume (503)."""

    status = 503
    retry_after = 5.0


class DiskFull(SourceError):
    """No room on the destination's file system: the partial pull is removed (507)."""

    status = 507


class NeedsRoom(SourceError):
    """An archive unpacks to more than the room its pull was given (``Allowance``):
    ``needed`` bytes. The verified archive is kept: the caller makes the room and pulls
    again, which unpacks it without a download (507 where it cannot)."""

    status = 507

    def __init__(self, message: str, needed: int) -> None:
        super().__init__(message)
        self.needed = needed


class PullStopped(SourceError):
    """The pull's stop event was set: the partial pull is kept for a resume (503)."""

    status = 503
    retry_after = 1.0


class SourceDenied(SourceError):
    """The source refused the credentials, or there were none (403)."""

    status = 403


def http_error(where: str, code: int, *, by: str = "the server",
               detail: str = "") -> SourceError:
    """The error an HTTP status from a source's server means (the one map for every
    scheme that speaks HTTP): 404/410 not found, 401/403 denied, 5xx/408/429
    unavailable, else a bad request; ``detail`` (the server's error code, a hint)
    follows the status."""
    said = f"HTTP {code}{detail}"
    if code in (404, 410):
        return SourceNotFound(f"{where}: not found ({said})")
    if code in (401, 403):
        return SourceDenied(f"{where}: access denied by {by} ({said})")
    if code >= 500 or code in (408, 429):
        return SourceUnavailable(f"{where}: {by} answered {said}")
    return SourceError(f"{where}: {by} refused the request ({said})")
