"""TLS for every listener and client: the ``tls:`` section (declared once, taken by the
agent's and the coordinator's configuration), the server's ``ssl.SSLContext`` reloaded
in place on SIGHUP (new handshakes get the new certificate, open connections stay), the
same certificates for gRPC, and client contexts.

A file that is missing, unreadable or does not fit is a ``ConfigError`` (a
``ValueError``) naming the file, the key and why (``/etc/edgeagent/key.pem:
tls.key_file: does not match cert_file ...``), at start and on reload (the running
certificates then stay)."""

from __future__ import annotations

import ssl
from collections import deque
from pathlib import Path
from typing import Annotated, Any

from agent.schema import Section, setting
from agent.validation import ConfigError, SchemaError, choice, unreadable

CLIENT_AUTH = ("none", "request", "require")
TLS_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
_VERIFY = {"none": ssl.CERT_NONE, "request": ssl.CERT_OPTIONAL, "require": ssl.CERT_REQUIRED}


class TlsSettings(Section):
    """A server's certificate and how it checks its clients' (``tls:``)."""

    cert_file: Annotated[Path, setting(
        "the server's certificate chain (PEM), leaf first",
        example="/etc/edgeagent/tls/server.crt")]
    key_file: Annotated[Path, setting(
        "the certificate's private key (PEM, unencrypted)",
        example="/etc/edgeagent/tls/server.key")]
    client_ca_file: Annotated[Path | None, setting(
        "CA certificates (PEM) that client certificates must chain to (client_auth "
        "request or require)", example="/etc/edgeagent/tls/clients-ca.crt")] = None
    client_auth: Annotated[str, setting(
        "none: no client certificate asked; request: checked when sent (gRPC asks for "
        "none); require: a connection without a valid one is refused (mutual TLS)",
        check=choice(*CLIENT_AUTH))] = "none"
    min_version: Annotated[str, setting(
        "the oldest TLS version accepted (HTTP; gRPC keeps its own floor, TLSv1.2)",
        check=choice(*TLS_VERSIONS))] = "TLSv1.2"

    def __post_init__(self) -> None:
        if self.client_auth != "none" and self.client_ca_file is None:
            raise ValueError(f"client_auth: {self.client_auth} needs client_ca_file")


def _read(path: Path, key: str) -> bytes:
    """The file's bytes; ``ConfigError`` naming it and ``key`` when it cannot be read."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise unreadable(path, key, exc) from None
    if b"-----BEGIN" not in data:
        raise ConfigError(path, key, "not a PEM file")
    return data


def _load_chain(ctx: ssl.SSLContext, cert_file: Path, key_file: Path,
                prefix: str) -> None:
    """``load_cert_chain`` with its failure said in words naming the files."""
    _read(cert_file, f"{prefix}cert_file")
    _read(key_file, f"{prefix}key_file")
    try:
        ctx.load_cert_chain(cert_file, key_file)
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc):
            raise ConfigError(key_file, f"{prefix}key_file",
                              f"does not match {prefix}cert_file {cert_file}") from None
        raise ConfigError(cert_file, f"{prefix}cert_file", "not a certificate and key "
                          f"OpenSSL can use ({exc.reason or exc})") from None


def _load_cas(ctx: ssl.SSLContext, ca_file: Path, key: str) -> None:
    _read(ca_file, key)
    try:
        ctx.load_verify_locations(cafile=ca_file)
    except ssl.SSLError as exc:
        raise ConfigError(ca_file, key, "no CA certificate OpenSSL can use "
                          f"({exc.reason or exc})") from None


class ServerTls:
    """One server's TLS: ``context`` for aiohttp, ``grpc_credentials()`` for gRPC; both
    take the files again on ``reload()``."""

    def __init__(self, settings: TlsSettings) -> None:
        self.settings = settings
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = TLS_VERSIONS[settings.min_version]
        self.context.verify_mode = _VERIFY[settings.client_auth]
        self.generation = 0  # counts loads: the gRPC fetcher's cue
        self._pem: tuple[bytes, bytes, bytes | None] = (b"", b"", None)
        self.reload()

    def reload(self) -> None:
        """Read the files again into the same context (checked on a scratch context
        first: a bad file leaves the running certificates in place)."""
        s = self.settings
        scratch = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        _load_chain(scratch, s.cert_file, s.key_file, "tls.")
        if s.client_ca_file is not None:
            _load_cas(scratch, s.client_ca_file, "tls.client_ca_file")
        _load_chain(self.context, s.cert_file, s.key_file, "tls.")
        if s.client_ca_file is not None:  # adds to the trusted set (rotation overlaps)
            self.context.load_verify_locations(cafile=s.client_ca_file)
        self._pem = (_read(s.key_file, "tls.key_file"), _read(s.cert_file, "tls.cert_file"),
                     _read(s.client_ca_file, "tls.client_ca_file")
                     if s.client_ca_file is not None else None)
        self.generation += 1

    def grpc_credentials(self) -> Any:
        """``grpc.ServerCredentials`` that ask this object for the certificates at each
        new handshake, so that a reload reaches gRPC too."""
        import grpc

        def configuration() -> Any:
            key, chain, cas = self._pem
            return grpc.ssl_server_certificate_configuration([(key, chain)], cas)

        seen = [self.generation]

        def fetch() -> Any:  # called by gRPC's threads: None keeps the current one
            if self.generation == seen[0]:
                return None
            seen[0] = self.generation
            return configuration()

        return grpc.dynamic_ssl_server_credentials(
            configuration(), fetch,
            require_client_authentication=self.settings.client_auth == "require")


def client_context(ca_file: Path | None = None, cert_file: Path | None = None,
                   key_file: Path | None = None, *, prefix: str = "",
                   kind: type[ssl.SSLContext] = ssl.SSLContext) -> ssl.SSLContext:
    """A client's context (of class ``kind``): the server verified against ``ca_file``
    (None: the system's CAs) and its name; ``cert_file``/``key_file``: this client's
    certificate."""
    ctx = kind(ssl.PROTOCOL_TLS_CLIENT)
    if ca_file is not None:
        _load_cas(ctx, ca_file, f"{prefix}ca_file")
    else:
        ctx.load_default_certs()
    if cert_file is not None or key_file is not None:
        if cert_file is None or key_file is None:
            raise SchemaError(f"{prefix}cert_file", f"goes with {prefix}key_file: give both")
        _load_chain(ctx, cert_file, key_file, prefix)
    return ctx


class ResumingContext(ssl.SSLContext):
    """A client context whose new connections resume a recent session to the same server
    name (TLS 1.3 tickets, or a TLS 1.2 session id): a reconnect spares the client the
    certificate chain's verification (what it saves: docs/benchmarks.md).
    asyncio and uvloop make every client connection through ``wrap_bio``, which takes
    the session. A connection's session is read when a later one starts (a TLS 1.3
    ticket comes after the handshake): the newest of the last ``RECENT`` connections
    that has one; a connection whose handshake is still going or failed has none and
    is passed over. A server that cannot resume it (a restart made new ticket keys)
    does a full handshake: nothing fails."""

    RECENT = 8

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        # server name -> its newest connections not yet read for a session
        self._recent: dict[Any, deque[ssl.SSLObject]] = {}
        self._sessions: dict[Any, ssl.SSLSession] = {}  # server name -> resumable session
        self._newest: dict[Any, ssl.SSLObject] = {}

    @classmethod
    def for_client(cls, ca_file: Path | None = None, cert_file: Path | None = None,
                   key_file: Path | None = None, *, prefix: str = "") -> "ResumingContext":
        """``client_context``'s context, resuming."""
        ctx = client_context(ca_file, cert_file, key_file, prefix=prefix, kind=cls)
        assert isinstance(ctx, cls)
        return ctx

    def wrap_bio(self, incoming: Any, outgoing: Any, server_side: bool = False,
                 server_hostname: Any = None, session: Any = None) -> ssl.SSLObject:
        if server_side:
            return super().wrap_bio(incoming, outgoing, server_side, server_hostname,
                                    session)
        recent = self._recent.setdefault(server_hostname, deque(maxlen=self.RECENT))
        if session is None:
            for obj in reversed(recent):
                fresh = _session_of(obj)
                if fresh is not None:
                    self._sessions[server_hostname] = fresh
                    recent.clear()  # older ones' sessions are older
                    break
            session = self._sessions.get(server_hostname)
        obj = super().wrap_bio(incoming, outgoing, server_side, server_hostname, session)
        recent.append(obj)
        self._newest[server_hostname] = obj
        return obj

    def resumed(self, server_hostname: Any) -> bool | None:
        """Whether the newest connection to ``server_hostname`` resumed a session (None:
        none was made)."""
        obj = self._newest.get(server_hostname)
        return None if obj is None else obj.session_reused


def _session_of(obj: ssl.SSLObject) -> ssl.SSLSession | None:
    """``obj``'s session when it can be resumed (None while its handshake goes on, after
    it failed, or without a ticket or id)."""
    try:
        session = obj.session
    except ValueError:  # OpenSSL cannot encode a session whose handshake did not end
        return None
    return session if session is not None and (session.has_ticket or session.id) else None


#: OpenSSL's verify codes (X509_V_ERR_*) the words of ``verify_failure`` cover.
_EXPIRED, _NOT_YET_VALID, _HOSTNAME = 10, 9, 62
_UNTRUSTED = (2, 18, 19, 20, 21)


def verify_failure(exc: BaseException, ca_file: Path | None) -> str | None:
    """Why a server's certificate was refused, in words (``server certificate expired``,
    ``not trusted by ca_file X``), from an exception that holds an
    ``ssl.SSLCertVerificationError``; None for any other failure."""
    found, todo = None, [exc]
    while todo and found is None:  # aiohttp (certificate_error), urllib (reason) wrap it
        seen = todo.pop()
        if isinstance(getattr(seen, "verify_code", None), int):
            found = seen
        todo += [e for e in (getattr(seen, "certificate_error", None),
                             getattr(seen, "reason", None), seen.__cause__)
                 if isinstance(e, BaseException)]
    if found is None:
        return None
    seen = found
    code = seen.verify_code
    if code == _EXPIRED:
        return "server certificate expired"
    if code == _NOT_YET_VALID:
        return "server certificate not yet valid"
    if code in _UNTRUSTED:
        return f"server certificate not trusted by ca_file {ca_file}" if ca_file \
            else "server certificate not trusted by the system's CAs (set ca_file)"
    if code == _HOSTNAME:
        return f"server certificate does not name this host ({seen.verify_message})"
    return f"server certificate refused: {seen.verify_message}"
