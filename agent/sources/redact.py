"""Credentials kept out of third-party logs: boto3/botocore log each signed request
(its headers, a session token among them) at DEBUG. ``redact_loggers`` adds to those
loggers a filter that blanks given secrets in every record they emit."""

from __future__ import annotations

import logging
from collections.abc import Iterable

#: The logger families of the clients a source uses.
FAMILIES = ("botocore", "boto3", "s3transfer", "urllib3")
REDACTED = "<redacted>"


class Redactor(logging.Filter):
    """Replaces each of its secrets in a record's message (the record passes on)."""

    def __init__(self) -> None:
        super().__init__()
        self.secrets: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.secrets:
            return True
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format is the logger's own problem
            return True
        cleaned = message
        for secret in self.secrets:
            cleaned = cleaned.replace(secret, REDACTED)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


def redact_loggers(secrets: Iterable[str | None], families: tuple[str, ...] = FAMILIES) -> None:
    """Blank ``secrets`` in what the loggers of ``families`` (those that exist now:
    the clients' modules are imported) log from now on; one filter per logger,
    sharing the secrets given over time."""
    wanted = {s for s in secrets if s and len(s) >= 8}
    if not wanted:
        return
    manager = logging.root.manager
    names = [n for n in list(manager.loggerDict)
             if any(n == f or n.startswith(f + ".") for f in families)]
    for name in names:
        logger = logging.getLogger(name)
        redactor = next((f for f in logger.filters if isinstance(f, Redactor)), None)
        if redactor is None:
            redactor = Redactor()
            logger.addFilter(redactor)
        redactor.secrets |= wanted
