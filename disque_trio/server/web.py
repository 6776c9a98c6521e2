"""The web port: the dashboard, health, metrics and the WebSocket gateway.

One listener (``web-port``, default client port + 1000) serves::

    GET /            the dashboard page (package data static/dashboard.html)
    GET /static/...  the other files of static/
    GET /healthz     200 "ok"; 503 "loading" while the AOF loads
    GET /metrics     Prometheus text format (server/metrics.py)
    GET /ws          WebSocket upgrade -> server/websocket.py

Every connection is read with h11 (``http.py``). trio-websocket alone would
answer a plain GET with 400, so only a request that is an upgrade to /ws is
handed over: the bytes h11 already read are replayed to trio-websocket's
server handshake through a :class:`ReplayStream`. Browsers may only connect
from an allowed Origin (``web-allowed-origins``; empty means the page's own
host:port), which stops any web page from driving a local node; clients that
send no Origin (command-line tools) are let in. Before anything else, a
request's Host must name this node (``localhost``, an IP address, a bind
address, or ``web-allowed-hosts``) or gets 421, /healthz excepted: that
stops DNS rebinding, where a page's own name is made to resolve to the node
and Origin and Host agree (see :func:`host_allowed`).

Each connection is one task (``handle``), the boundary of its errors: what
a peer can cause ends the connection, anything else is logged, and nothing
raises into the node. Open connections count against ``maxclients`` with
the RESP and WebSocket clients.

With ``tls-web yes`` the port speaks HTTPS and WSS instead, with the
certificate of the TLS client port (server/tls.py).

With ``requirepass`` set, every request but /healthz must carry the password
as HTTP Basic credentials (any user name) or ``Authorization: Bearer``, or is
answered 401 with a Basic challenge, so that a browser asks for it once and
then sends it with every request of the page, the /ws handshake included.
/ws also lets in a handshake without credentials (command-line tools, older
clients): that session must send AUTH first, as a RESP client must. A
handshake with credentials that are wrong gets 401 like any other request.
The password is read on every request, so CONFIG SET requirepass applies at
once.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import importlib.resources
import ipaddress
import logging
import mimetypes
from collections.abc import Iterable
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import h11
import trio
import trio_websocket
import wsproto.utilities

from . import metrics
from .clusterview import ClusterView
from .http import HttpConnection, HttpError, ReplayStream, header, linger
from .listen import Throttle, accept_loop
from .observe import NodeView
from .websocket import Hub, Session

if TYPE_CHECKING:
    from .host import ServerHost

log = logging.getLogger("disque_trio.web")

KEEPALIVE_S = 60.0  # an idle HTTP connection is closed
REQUEST_TIMEOUT_S = 20.0  # from a request's first byte to its end, or 408
RESPONSE_TIMEOUT_S = 60.0  # for sending an answer to a peer that reads it slowly
HANDSHAKE_TIMEOUT_S = 10.0
ERROR_ANSWER_S = 5.0  # for sending the answer to a request that broke HTTP
# The largest WebSocket message a client may send; larger ones close the
# socket with 1009 (trio-websocket enforces it). Requests are small: 1 MiB
# leaves room for big job bodies.
MAX_MESSAGE_BYTES = 1 << 20
# Frames trio-websocket buffers between its reader and ours: the session's
# reader never waits long (commands run in their own tasks), so a few do.
WS_RECEIVE_QUEUE = 4
STATIC_PACKAGE = "disque_trio"
STATIC_DIR = "static"
DASHBOARD = "dashboard.html"
_PLACEHOLDER = b"""<!doctype html>
<html><head><meta charset="utf-8"><title>disque-trio</title></head>
<body><h1>disque-trio</h1>
<p>The dashboard page is not installed. The node still serves
<a href="/healthz">/healthz</a>, <a href="/metrics">/metrics</a> and the
WebSocket at /ws.</p></body></html>
"""
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".json": "application/json",
    ".png": "image/png",
    ".ico": "image/x-icon",
}
_GET = ("GET", "HEAD")
REALM = "disque-trio"
_CHALLENGE = [("www-authenticate", f'Basic realm="{REALM}"')]
_OPEN_PATHS = frozenset({"/healthz"})  # answered without credentials
# Answered whatever the Host: load balancers and orchestrators probe nodes
# by address or by names of their own, and the answer tells nothing.
_ANY_HOST_PATHS = frozenset({"/healthz"})
LOCALHOST = "localhost"
_FULL_TEXT = b"max number of clients reached\n"
# Sent as soon as a connection beyond maxclients is accepted.
_FULL = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"server: disque-trio\r\n"
    b"content-type: text/plain; charset=utf-8\r\n"
    b"content-length: %d\r\n"
    b"cache-control: no-store\r\n"
    b"connection: close\r\n\r\n%s" % (len(_FULL_TEXT), _FULL_TEXT)
)


class WebServer:
    """Everything on the web port of one node."""

    def __init__(self, server: ServerHost) -> None:
        self.server = server
        self.view = NodeView(server)
        # The other nodes' figures and job copies, over the bus; it also
        # answers their questions, web port or not.
        self.cluster = ClusterView(server, self.view)
        self.hub = Hub(server, self.view, self.cluster)
        # Errors a connection ends on that the peer cannot cause (bugs) are
        # logged with their traceback, at most once every 10 s.
        self._throttle = Throttle()

    async def serve(
        self,
        listeners: list[trio.abc.Listener[trio.abc.Stream]],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.hub.run)
            for listener in listeners:
                nursery.start_soon(accept_loop, listener, self.handle, nursery, "web")
            task_status.started()

    async def handle(self, stream: trio.abc.Stream) -> None:
        """One connection of the web port, maybe upgraded to a WebSocket.

        This is the boundary of the connection: whatever goes wrong in it (a
        peer that breaks HTTP or WebSocket, hangs up mid-request, or a bug
        in a route) ends this connection and nothing else. Nothing raises
        into the web nursery, whose failure would end the node. With
        ``tls-web yes``, a TLS handshake comes first (bounded in time; a
        failure closes this connection only).
        """
        slot = _Slot(self.server)
        try:
            async with stream:
                if not slot.take():
                    if not self.server.tls.web:
                        await _refuse_full(stream)  # (in clear: useless over TLS)
                    return
                try:
                    if self.server.tls.web:
                        secure = await self.server.tls_accept(stream, "web")
                        if secure is None:
                            return
                        stream = secure
                    http = HttpConnection(stream)
                    try:
                        await self._requests(http, slot)
                    except HttpError as e:
                        await _answer_error(http, e)
                finally:
                    slot.release()
        except Exception as e:
            unexpected = _unexpected(e)
            if unexpected is not None:
                self._throttle.log(
                    logging.ERROR,
                    "bug",
                    "web connection: unexpected error, connection closed",
                    exc_info=unexpected,
                    logger=log,
                )

    async def _requests(self, http: HttpConnection, slot: _Slot) -> None:
        """Serve the requests of a keep-alive connection until it closes,
        idles for KEEPALIVE_S, or turns into a WebSocket."""
        while True:
            request = await http.next_request(KEEPALIVE_S, REQUEST_TIMEOUT_S)
            if request is None:
                return
            path = _path(request)
            if path not in _ANY_HOST_PATHS and not self.host_allowed(request):
                with trio.move_on_after(RESPONSE_TIMEOUT_S):
                    await _misdirected(http, request)
                return
            credentials = self.credentials(request)
            if path == "/ws" and credentials is not False:
                # Without credentials the session starts unauthenticated.
                await self._websocket(http, request, credentials is True, slot)
                return
            with trio.move_on_after(RESPONSE_TIMEOUT_S) as answering:
                if credentials is True or path in _OPEN_PATHS:
                    await self._route(http, request, path)
                else:
                    await self._unauthorized(http, request, credentials)
            if answering.cancelled_caught:
                return  # a peer that does not read its answers: close
            if not http.next_cycle():
                return

    # ------------------------------------------------------------ routes

    async def _route(self, http: HttpConnection, request: h11.Request, path: str) -> None:
        method = request.method.decode("latin-1")
        head = method == "HEAD"
        if path == "/" or path.startswith("/static/"):
            found = self._static(path)
            if found is None:
                await http.respond(404, b"not found\n", head_only=head)
            elif await _allow(http, method, _GET):
                await http.respond(200, found[0], found[1], head_only=head)
        elif path == "/healthz":
            if await _allow(http, method, _GET):
                status, text = self.health()
                await http.respond(status, text.encode() + b"\n", head_only=head)
        elif path == "/metrics":
            if await _allow(http, method, _GET):
                body = (await metrics.render(self.server, self.view)).encode()
                await http.respond(200, body, metrics.CONTENT_TYPE, head_only=head)
        else:
            await http.respond(404, b"not found\n", head_only=head)

    def host_allowed(self, request: h11.Request) -> bool:
        config = self.server.config
        binds = [*config.bind, *(host for host, _ in self.server.web_bound)]
        return host_allowed(header(request, b"host"), binds, config.web_allowed_hosts)

    def credentials(self, request: h11.Request) -> bool | None:
        """True when the request may go on: no ``requirepass``, or its
        ``Authorization`` header carries it (Basic, any user, or Bearer);
        None when it has no such header; False when the header is wrong."""
        expected = self.server.config.requirepass
        if not expected:
            return True
        value = header(request, b"authorization")
        if value is None:
            return None
        given = _password_in(value)
        if given is None:
            return False
        return hmac.compare_digest(given, expected.encode("utf-8", "surrogateescape"))

    async def _unauthorized(
        self, http: HttpConnection, request: h11.Request, credentials: bool | None
    ) -> None:
        reason = "authentication required" if credentials is None else "invalid credentials"
        body = (
            f"{reason}: send the node's requirepass as HTTP Basic credentials "
            "(any user name) or as Authorization: Bearer\n"
        )
        head = request.method == b"HEAD"
        await http.respond(401, body.encode(), headers=_CHALLENGE, head_only=head)

    def health(self) -> tuple[int, str]:
        if self.server.aof.loading:
            return 503, "loading"
        if self.server.shutdown_requested:
            return 503, "shutting down"
        return 200, "ok"

    def _static(self, path: str) -> tuple[bytes, str] | None:
        """(content, content type) of a packaged static file, or None."""
        name = DASHBOARD if path == "/" else path[len("/static/") :]
        parts = name.split("/")
        if any(p in ("", ".", "..") or "\\" in p or "\x00" in p for p in parts):
            return None  # no traversal, no directories
        files = importlib.resources.files(STATIC_PACKAGE).joinpath(STATIC_DIR, *parts)
        try:
            data = files.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            if name == DASHBOARD:
                return _PLACEHOLDER, _TYPES[".html"]
            return None
        except OSError:
            return None
        return data, _content_type(name)

    # --------------------------------------------------------- websocket

    async def _websocket(
        self, http: HttpConnection, request: h11.Request, authenticated: bool, slot: _Slot
    ) -> None:
        method = request.method.decode("latin-1")
        if not await _allow(http, method, ("GET",)):
            return
        problem = _upgrade_problem(request)
        if problem is not None:
            status, reason = problem
            extra = [("sec-websocket-version", "13")] if status == 426 else []
            await http.respond(status, f"{reason}\n".encode(), headers=extra)
            return
        stream = ReplayStream(http.stream, http.raw_request())
        async with trio.open_nursery() as nursery:
            with trio.move_on_after(HANDSHAKE_TIMEOUT_S) as handshake:
                ws_request = await trio_websocket.wrap_server_stream(
                    nursery,
                    stream,
                    message_queue_size=WS_RECEIVE_QUEUE,
                    max_message_size=MAX_MESSAGE_BYTES,
                )
            if handshake.cancelled_caught:
                nursery.cancel_scope.cancel()
                return
            await self._session(ws_request, request, http.stream, authenticated, slot)
            nursery.cancel_scope.cancel()

    async def _session(
        self,
        ws_request: trio_websocket.WebSocketRequest,
        request: h11.Request,
        stream: trio.abc.Stream,
        authenticated: bool,
        slot: _Slot,
    ) -> None:
        if not self.origin_allowed(request):
            origin = header(request, b"origin")
            body = f"origin {origin} is not allowed (web-allowed-origins)\n".encode()
            await ws_request.reject(403, body=body)
            return
        # The connection's place under maxclients passes to the client (no
        # checkpoint in between: nobody else can take it meanwhile).
        slot.release()
        client = self.server.new_client(stream, "websocket")
        if client is None:
            await ws_request.reject(503, body=b"max number of clients reached\n")
            return
        if authenticated:
            client.authenticated = True  # the handshake carried the password
        try:
            ws = await ws_request.accept()
            with trio.CancelScope() as scope:
                client.cancel_scope = scope  # CLIENT KILL, shutdown
                await Session(self.server, self.hub, ws, client).run()
            with trio.move_on_after(1.0) as closing:
                closing.shield = True
                await ws.aclose()
        finally:
            self.server.drop_client(client)

    def origin_allowed(self, request: h11.Request) -> bool:
        origin = header(request, b"origin")
        if origin is None:
            return True  # not a browser: the origin rule protects browsers
        allowed = self.server.config.web_allowed_origins
        if allowed:
            wanted = _normal_origin(origin)
            return any(a == "*" or _normal_origin(a) == wanted for a in allowed)
        host = header(request, b"host")
        default_port = 443 if self.server.tls.web else 80
        return host is not None and _origin_host(origin) == _host_port(host, default_port)


class _Slot:
    """The place of one web connection under ``maxclients``."""

    def __init__(self, server: ServerHost) -> None:
        self.server = server
        self.held = False

    def take(self) -> bool:
        self.held = self.server.open_web_connection()
        return self.held

    def release(self) -> None:
        if self.held:
            self.held = False
            self.server.close_web_connection()


async def _refuse_full(stream: trio.abc.Stream) -> None:
    """Answer a connection beyond maxclients without reading its request."""
    with trio.move_on_after(ERROR_ANSWER_S):
        try:
            await stream.send_all(_FULL)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return
    await linger(stream)


# What a peer can cause by itself, by breaking a protocol or hanging up at
# any moment: these end its connection quietly.
_PEER_ERRORS: tuple[type[Exception], ...] = (
    HttpError,
    h11.RemoteProtocolError,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
    trio_websocket.ConnectionClosed,
    trio_websocket.HandshakeError,
    # trio-websocket 0.12 lets wsproto's errors out of its reader task when
    # a peer's timing is unlucky: a ping that arrives after the node began
    # closing is answered, and wsproto refuses to send the pong
    # (python-trio/trio-websocket#184).
    wsproto.utilities.LocalProtocolError,
    wsproto.utilities.RemoteProtocolError,
    OSError,
)


def _unexpected(error: Exception) -> Exception | None:
    """The part of a connection's error that the peer alone cannot cause
    (a bug, to be logged), or None. Nurseries (the WebSocket's) group the
    errors of their tasks: those are split."""
    if isinstance(error, ExceptionGroup):
        _, rest = error.split(_PEER_ERRORS)
        return rest
    return None if isinstance(error, _PEER_ERRORS) else error


async def _answer_error(http: HttpConnection, error: HttpError) -> None:
    """Answer a request that broke HTTP, if the connection still allows an
    answer, and close gracefully; the peer may be gone already."""
    if not http.can_respond():
        return
    with trio.move_on_after(ERROR_ANSWER_S):
        try:
            body = f"{error.reason}\n".encode()
            await http.respond(error.status, body, headers=[("connection", "close")])
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, h11.ProtocolError):
            return
    await linger(http.stream)


def _path(request: h11.Request) -> str:
    """The path of a request's target (origin or absolute form)."""
    try:
        return urlsplit(request.target.decode("latin-1")).path
    except ValueError:  # "http://[::1/", brackets that do not close
        raise HttpError(400, "bad request target") from None


def host_allowed(host: str | None, binds: Iterable[str], extra: Iterable[str]) -> bool:
    """Whether a request's Host header names this node, against DNS
    rebinding: a page of some name that later resolves to the node's address
    gets the browser to send requests, with that name in Host, that the
    same-origin rule treats as its own. Allowed: no Host at all (only
    HTTP/1.0 goes without, never a browser), an IP address (a page whose URL
    holds an address has that address as its origin: no name to rebind),
    ``localhost``, a name among the bind addresses, or one of ``extra``
    (``web-allowed-hosts``, where ``*`` allows any). Ports are not compared."""
    if host is None:
        return True
    name = _host_name(host)
    if name is None:
        return False
    if _is_ip(name) or name == LOCALHOST:
        return True
    allowed = {_normal_host(h) for h in (*binds, *extra)}
    return "*" in allowed or name in allowed


def _host_name(host: str) -> str | None:
    """The host of a Host header (no port, no brackets), normalised; None
    when it is not a valid host[:port]."""
    value = host.strip()
    if not value or any(c in value for c in "/?#@\\ \t"):
        return None
    try:
        parts = urlsplit("//" + value)
        parts.port  # noqa: B018  (raises ValueError for a bad port)
    except ValueError:  # a bad port, or brackets that do not close
        return None
    if parts.hostname is None:
        return None
    return _normal_host(parts.hostname)


def _normal_host(name: str) -> str:
    return name.strip().strip("[]").rstrip(".").lower()


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


async def _misdirected(http: HttpConnection, request: h11.Request) -> None:
    host = header(request, b"host") or ""
    body = (
        f"this node does not answer to the host {host!r}: add the name to "
        "web-allowed-hosts, or use an address\n"
    )
    head = request.method == b"HEAD"
    headers = [("connection", "close")]
    await http.respond(421, body.encode(), headers=headers, head_only=head)


def _upgrade_problem(request: h11.Request) -> tuple[int, str] | None:
    """Why a request to /ws is not a WebSocket handshake we accept."""
    upgrade = (header(request, b"upgrade") or "").lower()
    connection = (header(request, b"connection") or "").lower()
    if "websocket" not in upgrade or "upgrade" not in (t.strip() for t in connection.split(",")):
        return 426, "this endpoint speaks WebSocket only (Upgrade: websocket)"
    if header(request, b"sec-websocket-version") != "13":
        return 426, "unsupported WebSocket version (13 only)"
    key = header(request, b"sec-websocket-key")
    if not key:
        return 400, "missing Sec-WebSocket-Key"
    if not valid_websocket_key(key):
        return 400, "Sec-WebSocket-Key must be the base64 of 16 bytes"
    return None


def valid_websocket_key(key: str) -> bool:
    """RFC 6455 4.1: the base64 of 16 bytes (24 characters, padded)."""
    try:
        return len(base64.b64decode(key.strip().encode("ascii"), validate=True)) == 16
    except (binascii.Error, ValueError):
        return False


def _normal_origin(origin: str) -> str:
    return origin.strip().rstrip("/").lower()


def _origin_host(origin: str) -> tuple[str, int] | None:
    """(host, port) of an Origin header, the scheme's port when unsaid."""
    try:
        parts = urlsplit(origin.strip())
    except ValueError:  # "http://[::1" and the like
        return None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return None  # "null" (file:// pages, sandboxed frames) never matches
    return _host_port(parts.netloc, 443 if parts.scheme == "https" else 80)


def _host_port(netloc: str, default_port: int) -> tuple[str, int] | None:
    try:
        parts = urlsplit("//" + netloc.strip())
        port = parts.port or default_port
    except ValueError:
        return None
    return (parts.hostname or "", port)


def _password_in(authorization: str) -> bytes | None:
    """The password an Authorization header value carries (Basic: the part
    after the first colon of the decoded pair; Bearer: the token), or None
    for another scheme or a malformed value. Bytes as the client sent them
    (UTF-8 from browsers and Prometheus)."""
    scheme, _, rest = authorization.strip().partition(" ")
    rest = rest.strip()
    raw = rest.encode("latin-1")  # the header's own bytes, see header()
    if scheme.lower() == "bearer" and raw:
        return raw
    if scheme.lower() != "basic":
        return None
    try:
        pair = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        return None
    _user, colon, password = pair.partition(b":")
    return password if colon else None


def _content_type(name: str) -> str:
    dot = name.rfind(".")
    ext = name[dot:].lower() if dot >= 0 else ""
    return _TYPES.get(ext) or mimetypes.guess_type(name)[0] or "application/octet-stream"


async def _allow(http: HttpConnection, method: str, allowed: tuple[str, ...]) -> bool:
    """Answer 405 (and False) unless the method is one of ``allowed``."""
    if method in allowed:
        return True
    await http.respond(405, b"method not allowed\n", headers=[("allow", ", ".join(allowed))])
    return False
