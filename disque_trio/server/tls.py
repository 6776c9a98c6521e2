"""TLS on the client port, the web port and the cluster bus (optional).

The SSL contexts are built once, at start-up, from the ``tls-*`` directives
(:meth:`TlsContexts.from_config`); a certificate, key or CA file that is
missing, unreadable or wrong is a :class:`ConfigError` with one line, which
the CLI prints as a fatal configuration error before anything is bound.

TLS wraps the streams ``Env.net`` gives (``trio.SSLStream`` over them): the
node still reaches the network only through its Env, and a node without TLS
(every simulated one) runs exactly the code it ran before, with no context
built and nothing wrapped.

Three contexts:

- ``clients``: the server side of the TLS client port and, with
  ``tls-web yes``, of the web port. Client certificates per
  ``tls-auth-clients`` (``no``: none asked; ``optional``: checked against
  ``tls-ca-cert-file`` when sent; ``yes``: required and checked);
- ``bus_server`` and ``bus_client`` (``tls-cluster yes``): both ends of a
  bus link present the node's certificate and require the other's, signed
  by ``tls-ca-cert-file``. Host names are not checked (peers are dialled by
  announced IP addresses, which move): the CA vouches for cluster members,
  so it should be one that signs nothing else.

Every handshake is bounded by ``HANDSHAKE_TIMEOUT_S``: a connection that
opens a TLS port and sends nothing, or stalls half-way, is closed then. A
failed handshake (plain text, a refused certificate, a peer gone) ends that
connection only, and raises :class:`TlsHandshakeError` for the caller to
log the way its port logs refusals.
"""

from __future__ import annotations

import ssl
from typing import TypeAlias

import attrs
import trio

from ..config import Config, ConfigError

HANDSHAKE_TIMEOUT_S = 5.0  # as the bus's own handshake (peers.HANDSHAKE_TIMEOUT_S)
MIN_VERSION = ssl.TLSVersion.TLSv1_2

TlsStream: TypeAlias = trio.SSLStream[trio.abc.Stream]

_CLIENT_VERIFY = {
    "no": ssl.CERT_NONE,
    "optional": ssl.CERT_OPTIONAL,
    "yes": ssl.CERT_REQUIRED,
}


class TlsHandshakeError(Exception):
    """A TLS handshake failed or took too long; the message says why."""


@attrs.frozen
class TlsContexts:
    """The node's SSL contexts; None where TLS is off."""

    clients: ssl.SSLContext | None = None
    bus_server: ssl.SSLContext | None = None
    bus_client: ssl.SSLContext | None = None
    web: bool = False  # the web port speaks HTTPS (with the clients context)

    @property
    def web_context(self) -> ssl.SSLContext | None:
        return self.clients if self.web else None

    @classmethod
    def from_config(cls, config: Config) -> TlsContexts:
        """Contexts for what the configuration turns on. Raises ConfigError
        (one line) when a file is missing, unreadable, not PEM, or when the
        key does not match the certificate."""
        serve_clients = bool(config.tls_port) or config.tls_web
        if not (serve_clients or config.tls_cluster):
            return cls()
        wants = [
            name
            for name, on in (
                ("tls-port", bool(config.tls_port)),
                ("tls-web", config.tls_web),
                ("tls-cluster", config.tls_cluster),
            )
            if on
        ]
        missing = [
            name
            for name, value in (
                ("tls-cert-file", config.tls_cert_file),
                ("tls-key-file", config.tls_key_file),
            )
            if not value
        ]
        if missing:
            verb = "needs" if len(wants) == 1 else "need"
            raise ConfigError(f"{' and '.join(wants)} {verb} {' and '.join(missing)}")
        needs_ca = config.tls_cluster or (serve_clients and config.tls_auth_clients != "no")
        if needs_ca and not config.tls_ca_cert_file:
            why = (
                "tls-cluster yes"
                if config.tls_cluster
                else f"tls-auth-clients {config.tls_auth_clients}"
            )
            raise ConfigError(
                f"{why} needs tls-ca-cert-file (the CA that signs the peers' certificates)"
            )
        _check_certificates("tls-cert-file", config.tls_cert_file)
        _read_file("tls-key-file", config.tls_key_file)
        if config.tls_ca_cert_file:
            _check_certificates("tls-ca-cert-file", config.tls_ca_cert_file)
        clients = None
        if serve_clients:
            clients = _context(config, server_side=True)
            clients.verify_mode = _CLIENT_VERIFY[config.tls_auth_clients]
        bus_server = bus_client = None
        if config.tls_cluster:
            bus_server = _context(config, server_side=True)
            bus_server.verify_mode = ssl.CERT_REQUIRED
            bus_client = _context(config, server_side=False)
            bus_client.check_hostname = False
            bus_client.verify_mode = ssl.CERT_REQUIRED
        return cls(clients, bus_server, bus_client, config.tls_web)


def _read_file(directive: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(f"Can't read {directive} '{path}': {e.strerror or e}") from None


def _check_certificates(directive: str, path: str) -> None:
    """The file must hold at least one PEM certificate."""
    _read_file(directive, path)
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=path)
    except ssl.SSLError:
        raise ConfigError(f"{directive} '{path}' holds no PEM certificate") from None


def _context(config: Config, *, server_side: bool) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server_side else ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = MIN_VERSION
    # TLS 1.2 renegotiation is a handshake a client could repeat at will.
    context.options |= ssl.OP_NO_RENEGOTIATION
    password = config.tls_key_file_pass.encode("utf-8", "surrogateescape")
    try:
        # A callable, never None: OpenSSL would ask for the pass phrase of
        # an encrypted key on the terminal.
        context.load_cert_chain(config.tls_cert_file, config.tls_key_file, lambda: password)
    except ssl.SSLError as e:
        raise ConfigError(_key_problem(config, e)) from None
    except OSError as e:
        raise ConfigError(
            f"Can't load tls-cert-file '{config.tls_cert_file}' with tls-key-file "
            f"'{config.tls_key_file}': {e.strerror or e}"
        ) from None
    if config.tls_ca_cert_file:
        context.load_verify_locations(cafile=config.tls_ca_cert_file)
    return context


def _key_problem(config: Config, e: ssl.SSLError) -> str:
    key = config.tls_key_file
    if e.reason == "KEY_VALUES_MISMATCH":
        return f"tls-key-file '{key}' is not the key of tls-cert-file '{config.tls_cert_file}'"
    if b"ENCRYPTED" in _read_file("tls-key-file", key):
        said = "wrong" if config.tls_key_file_pass else "not set"
        return f"tls-key-file '{key}' is encrypted and tls-key-file-pass is {said}"
    return f"tls-key-file '{key}' holds no PEM private key"


async def accept(stream: trio.abc.Stream, context: ssl.SSLContext) -> TlsStream:
    """The server side of a handshake on an accepted stream. Raises
    TlsHandshakeError; the caller closes ``stream`` either way."""
    tls = trio.SSLStream(stream, context, server_side=True, https_compatible=True)
    await _handshake(tls)
    return tls


async def connect(stream: trio.abc.Stream, context: ssl.SSLContext) -> TlsStream:
    """The client side of a handshake on a stream we opened (a bus link)."""
    tls = trio.SSLStream(stream, context, https_compatible=True)
    await _handshake(tls)
    return tls


async def _handshake(tls: TlsStream) -> None:
    try:
        with trio.fail_after(HANDSHAKE_TIMEOUT_S):
            await tls.do_handshake()
    except trio.TooSlowError:
        raise TlsHandshakeError(f"no TLS handshake within {HANDSHAKE_TIMEOUT_S:g} s") from None
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
        raise TlsHandshakeError(describe(e)) from None


def describe(e: BaseException) -> str:
    """The reason of a failed handshake in a few words: OpenSSL's, when
    there is one (``certificate verify failed: ...``, ``http request``)."""
    cause: BaseException | None = e
    while cause is not None:
        if isinstance(cause, ssl.SSLCertVerificationError) and cause.verify_message:
            return f"certificate verify failed: {cause.verify_message}"
        if isinstance(cause, ssl.SSLError):
            return str(cause.reason or cause).replace("_", " ").lower()
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror.lower()
        cause = cause.__cause__ or cause.__context__
    return "the connection closed during the TLS handshake"


def unwrap(stream: trio.abc.Stream) -> trio.abc.Stream:
    """The transport under any TLS layers (for its socket's addresses)."""
    while isinstance(stream, trio.SSLStream):
        stream = stream.transport_stream
    return stream
