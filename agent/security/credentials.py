"""Bearer credentials with scopes, shared by the node agent and the coordinator.

A server knows its tokens only by their SHA-256: a token file is a YAML list of
``{name, sha256, scopes, not_after, node}`` (``edgeagent token new`` prints a fresh token
once and the entry to add). The old one-token ``admin_token_file`` still works: its
token has the ``admin`` scope. A token is found by its hash (``Credentials.find``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from agent.wire import NAME

#: What a credential may do. ``admin`` may do everything the others may; ``peer`` is a
#: fleet node forwarding a request (``agent.node.routing``): it may infer too.
SCOPES = ("admin", "read", "infer", "report", "peer")
#: Shorter tokens are refused at start: a guessable token is no token.
MIN_TOKEN_LENGTH = 32
_HEX64 = re.compile(r"[0-9a-f]{64}")
_ENTRY_KEYS = ("name", "sha256", "scopes", "not_after", "node")


class CredentialError(ValueError):
    """A token file or token that cannot be used (its message names the file and entry)."""


@dataclass(frozen=True)
class Credential:
    """One accepted token, known by its hash: what it may do, until when, and for which
    node (a node credential may write only its own report)."""

    name: str
    sha256: str
    scopes: frozenset[str]
    not_after: float | None = None
    node: str | None = None

    def allows(self, scope: str) -> bool:
        return "admin" in self.scopes or scope in self.scopes \
            or (scope == "infer" and "peer" in self.scopes)

    def valid_at(self, now: float) -> bool:
        return self.not_after is None or now <= self.not_after

    def entry(self) -> dict[str, Any]:
        """Its token-file entry (YAML-ready)."""
        out: dict[str, Any] = {"name": self.name, "sha256": self.sha256,
                               "scopes": sorted(self.scopes)}
        if self.not_after is not None:
            out["not_after"] = dt.datetime.fromtimestamp(
                self.not_after, dt.timezone.utc).isoformat(timespec="seconds")
        if self.node is not None:
            out["node"] = self.node
        return out


def node_credential(node: str, digest: str) -> Credential:
    """The credential a node obtained by joining (its hash kept in the store)."""
    return Credential(f"node:{node}", digest, frozenset({"report"}), node=node)


def token_hash(token: str) -> str:
    """The hex SHA-256 a server keeps of ``token``."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A fresh random token (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def check_token_length(token: str, source: str) -> str:
    if len(token) < MIN_TOKEN_LENGTH:
        raise CredentialError(
            f"the token in {source} is {len(token)} characters long; tokens must have at "
            f"least {MIN_TOKEN_LENGTH} (make one with: edgeagent token new --scope admin)")
    return token


def read_token(path: str | Path | None) -> str | None:
    """The token a client sends, from ``path`` (stripped), None without a path; an
    empty file is an error."""
    if path is None:
        return None
    token = Path(path).read_text().strip()
    if not token:
        raise CredentialError(f"token file {path} is empty")
    return token


def write_secret(path: Path, secret: str) -> None:
    """``secret`` into ``path``, readable by this user only, replaced atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    os.chmod(part, 0o600)
    os.replace(part, path)


def read_secret(path: str | Path) -> str:
    """The token a server accepts, from ``path`` (``read_token``; a short token is an
    error too)."""
    return check_token_length(read_token(path), f"token file {path}")


def parse_time(value: Any, where: str) -> float:
    """A ``not_after``: an ISO 8601 time (UTC unless it names a zone) or epoch seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, dt.datetime):
        stamp = value
    elif isinstance(value, str):
        try:
            stamp = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise CredentialError(f"{where}: not_after {value!r} is not an ISO 8601 time "
                                  f"(e.g. 2027-01-31T00:00:00Z)") from None
    else:
        raise CredentialError(f"{where}: not_after must be a time, got {value!r}")
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.timezone.utc)
    return stamp.timestamp()


def parse_entry(entry: Any, where: str) -> Credential:
    """One token-file entry, checked; CredentialError naming what is wrong."""
    if not isinstance(entry, dict):
        raise CredentialError(f"{where}: an entry must be a mapping, got {entry!r}")
    unknown = sorted(set(entry) - set(_ENTRY_KEYS))
    if unknown:
        raise CredentialError(f"{where}: unknown key(s) {unknown}; an entry has "
                              f"{list(_ENTRY_KEYS)}")
    name = entry.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise CredentialError(f"{where}: name must be letters, digits, '.', '_', '-', "
                              f"got {name!r}")
    digest = entry.get("sha256")
    if not isinstance(digest, str) or not _HEX64.fullmatch(digest.lower()):
        raise CredentialError(f"{where} ({name}): sha256 must be 64 hex digits (the "
                              f"token's SHA-256; edgeagent token new prints it)")
    scopes = entry.get("scopes")
    if isinstance(scopes, str):
        scopes = [scopes]
    if not isinstance(scopes, list) or not scopes or any(s not in SCOPES for s in scopes):
        raise CredentialError(f"{where} ({name}): scopes must be a list of {SCOPES}, "
                              f"got {entry.get('scopes')!r}")
    node = entry.get("node")
    if node is not None and (not isinstance(node, str) or not NAME.fullmatch(node)):
        raise CredentialError(f"{where} ({name}): node must be a node name, got {node!r}")
    if "report" in scopes and node is None:
        raise CredentialError(f"{where} ({name}): a report credential names its node "
                              f"(node: edge-1): a node may write only its own report")
    not_after = entry.get("not_after")
    return Credential(name, digest.lower(), frozenset(scopes),
                      None if not_after is None else parse_time(not_after, f"{where} ({name})"),
                      node)


def load_token_file(path: str | Path) -> list[Credential]:
    """The entries of a token file (YAML list); CredentialError naming the file."""
    import yaml

    try:
        doc = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as exc:
        raise CredentialError(f"token file {path} is not YAML: {exc}") from None
    if doc is None:
        return []
    if not isinstance(doc, list):
        raise CredentialError(f"token file {path} must be a list of entries "
                              f"({', '.join(_ENTRY_KEYS)})")
    creds = [parse_entry(entry, f"{path} entry {i + 1}") for i, entry in enumerate(doc)]
    names = [c.name for c in creds]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise CredentialError(f"token file {path}: name(s) {twice} appear twice")
    return creds


def load_credentials(admin_token_file: str | Path | None,
                     token_file: str | Path | None) -> list[Credential]:
    """What a server accepts: the admin token's (scope admin) and the token file's."""
    creds = []
    if admin_token_file is not None:
        creds.append(Credential("admin_token_file", token_hash(read_secret(admin_token_file)),
                                frozenset({"admin"})))
    if token_file is not None:
        creds.extend(load_token_file(token_file))
    return creds


def bearer(header: str) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` value (None otherwise)."""
    if header[:7].lower() != "bearer ":
        return None
    return header[7:].strip() or None


class Credentials:
    """The credentials one server accepts now, and the node certificates it refuses
    (``revoked``: node -> the time up to which its certificates were issued);
    ``replace`` swaps them (SIGHUP, a node deleted)."""

    def __init__(self, creds: Iterable[Credential] = (),
                 revoked: Mapping[str, float] | None = None) -> None:
        self.replace(creds, revoked)

    def replace(self, creds: Iterable[Credential],
                revoked: Mapping[str, float] | None = None) -> None:
        self.creds: tuple[Credential, ...] = tuple(creds)
        self.revoked: dict[str, float] = dict(revoked or {})
        self._by_hash: dict[str, Credential] = {}
        for cred in reversed(self.creds):  # the first entry of a hash listed twice
            self._by_hash[cred.sha256] = cred

    def revoked_since(self, node: str, issued: float | None) -> float | None:
        """When certificates naming ``node`` issued at ``issued`` (its notBefore; None:
        not known) were revoked, or None where such a certificate is not."""
        cutoff = self.revoked.get(node)
        return None if cutoff is None or (issued is not None and issued > cutoff) else cutoff

    def __bool__(self) -> bool:
        """Whether any credential is configured (none: nothing is checked)."""
        return bool(self.creds)

    def find(self, token: str | None, now: float) -> Credential | None:
        """The credential ``token`` is, unexpired. Looked up by the token's SHA-256 (a
        coordinator may know 10,000 nodes): what the lookup's timing could tell is about
        that hash, which says nothing of a token; the match is then confirmed in
        constant time."""
        if token is None:
            return None
        digest = token_hash(token)
        found = self._by_hash.get(digest)
        if found is None or not hmac.compare_digest(digest.encode(), found.sha256.encode()):
            return None
        return found if found.valid_at(now) else None
