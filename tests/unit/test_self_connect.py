"""A TCP self-connection (a connect to a loopback port nobody listens on,
given that same port as its source) is refused at once and reset. A link
task reconnecting to a killed peer's bus port got one, held it open while
its handshake failed, and the peer, restarting, could not bind its port
(the original's Tcl suite, 07-persistence, mass restart)."""

from __future__ import annotations

import socket

import pytest
import trio

from disque_trio import env as env_module
from disque_trio.env import TcpNet

from ..helpers import free_port


def _self_connected(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.connect(("127.0.0.1", port))  # simultaneous open with itself
    return sock


async def test_a_self_connection_is_refused_and_leaves_the_port_free(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = free_port()

    async def open_tcp_stream(host: str, port_: int) -> trio.SocketStream:
        sock = _self_connected(port_)
        return trio.SocketStream(trio.socket.from_stdlib_socket(sock))

    monkeypatch.setattr(env_module.trio, "open_tcp_stream", open_tcp_stream)
    with pytest.raises(ConnectionRefusedError, match="connected to itself"):
        await TcpNet().connect("127.0.0.1", port)
    monkeypatch.undo()
    # Closed at once: the port's owner can bind it again.
    listeners = await TcpNet().open_listeners("127.0.0.1", port)
    for listener in listeners:
        await listener.aclose()
