"""TLS on the client port, the web port and the cluster bus, with real
processes on loopback and throwaway certificates (tests/tlscerts.py: the
``openssl`` command line; skipped without it). Every wait is bounded."""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..helpers import free_port
from ..tlscerts import KEY_PASSWORD, Pki, make_pki
from .conftest import NodeProcess
from .test_cli import one_error_line, run_cli
from .test_cluster_procs import client, nodes_lines, start_cluster, wait_for

WAIT_S = 10.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def tls_node(node_factory: object, pki: Pki, *extra: str) -> tuple[NodeProcess, int]:
    """A node with its plain port (for the fixture's readiness check) and a
    TLS port; returns the node and its TLS port."""
    tls_port = free_port()
    args = ["--tls-port", str(tls_port), *pki.node_args(), *extra]
    return node_factory(*args), tls_port  # type: ignore[operator]


def tls_redis(port: int, pki: Pki, **kwargs: object) -> redis.Redis:
    """redis-py over TLS, without its retries (a refused connection fails
    at once instead of after a few seconds of back-off)."""
    return redis.Redis(
        port=port,
        retry=Retry(NoBackoff(), 0),
        ssl=True,
        ssl_ca_certs=pki.ca,
        socket_timeout=WAIT_S,
        socket_connect_timeout=WAIT_S,
        decode_responses=True,
        **kwargs,  # type: ignore[arg-type]
    )


def client_context(pki: Pki, cert: str | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=pki.ca)
    if cert is not None:
        context.load_cert_chain(pki.path(f"{cert}.crt"), pki.path(f"{cert}.key"))
    return context


def tls_ping(port: int, context: ssl.SSLContext) -> bytes:
    """PING over a TLS socket; the raw reply."""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as s,
    ):
        s.sendall(b"PING\r\n")
        return s.recv(64)


def refused(port: int, context: ssl.SSLContext) -> bool:
    """Whether a TLS PING gets no answer: the handshake fails, or (TLS 1.3:
    the client's side completes before the node checks its certificate)
    the node closes the connection."""
    try:
        return tls_ping(port, context) == b""
    except (ssl.SSLError, ConnectionError):
        return True


def closed_by_peer(sock: socket.socket, timeout: float) -> bool:
    """Whether the node closes the connection within ``timeout`` (reads
    and drops whatever it sends first: a TLS alert)."""
    sock.settimeout(timeout)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not sock.recv(4096):
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return False


def info_field(r: redis.Redis, section: str, name: str) -> object:
    return r.info(section)[name]


# ----------------------------------------------------------- client port


def test_redis_cli_over_tls(node_factory: object, pki: Pki) -> None:
    cli = shutil.which("redis-cli")
    if cli is None:
        pytest.skip("redis-cli is not installed")
    _, port = tls_node(node_factory, pki)

    def run(*args: str) -> str:
        result = subprocess.run(
            [cli, "-p", str(port), "--tls", "--cacert", pki.ca, *args],
            capture_output=True,
            text=True,
            timeout=WAIT_S,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    assert run("PING") == "PONG"
    job_id = run("ADDJOB", "q", "over tls", "0")
    assert job_id.startswith("D-")
    assert run("GETJOB", "FROM", "q").splitlines() == ["q", job_id, "over tls"]


def test_redis_py_over_tls_and_plain_side_by_side(node_factory: object, pki: Pki) -> None:
    node, port = tls_node(node_factory, pki)
    secure = tls_redis(port, pki)
    plain = redis.Redis(port=node.port, socket_timeout=WAIT_S, decode_responses=True)
    assert secure.ping()
    job_id = secure.execute_command("ADDJOB", "q", "hello", 0)
    assert plain.execute_command("QLEN", "q") == 1
    assert secure.execute_command("GETJOB", "FROM", "q") == [["q", job_id, "hello"]]
    assert secure.execute_command("ACKJOB", job_id) == 1
    # HELLO announces the plain port while there is one.
    assert secure.execute_command("HELLO")[2][2] == str(node.port)
    secure.close()
    plain.close()


def test_requirepass_applies_over_tls(node_factory: object, pki: Pki) -> None:
    _, port = tls_node(node_factory, pki, "--requirepass", "pw")
    with pytest.raises(redis.AuthenticationError):
        tls_redis(port, pki).ping()
    assert tls_redis(port, pki, password="pw").ping()


def test_client_certificate_required(node_factory: object, pki: Pki) -> None:
    _, port = tls_node(
        node_factory, pki, "--tls-auth-clients", "yes", "--tls-ca-cert-file", pki.ca
    )
    with pytest.raises(redis.ConnectionError):
        tls_redis(port, pki).ping()  # no certificate
    with pytest.raises(redis.ConnectionError):
        tls_redis(
            port, pki, ssl_certfile=pki.path("stranger.crt"), ssl_keyfile=pki.path("stranger.key")
        ).ping()  # a certificate from another CA
    good = tls_redis(
        port, pki, ssl_certfile=pki.path("client.crt"), ssl_keyfile=pki.path("client.key")
    )
    assert good.ping()
    assert good.execute_command("ADDJOB", "q", "x", 0).startswith("D-")
    assert int(info_field(good, "stats", "tls_handshake_failures")) >= 2  # type: ignore[call-overload]
    good.close()


def test_client_certificate_optional(node_factory: object, pki: Pki) -> None:
    _, port = tls_node(
        node_factory, pki, "--tls-auth-clients", "optional", "--tls-ca-cert-file", pki.ca
    )
    assert tls_ping(port, client_context(pki)) == b"+PONG\r\n"
    assert tls_ping(port, client_context(pki, "client")) == b"+PONG\r\n"
    assert refused(port, client_context(pki, "stranger"))  # sent, so checked


def test_plain_text_to_the_tls_port_is_closed(node_factory: object, pki: Pki) -> None:
    node, port = tls_node(node_factory, pki)
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as s:
        s.sendall(b"PING\r\n")
        assert closed_by_peer(s, WAIT_S)
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert closed_by_peer(s, WAIT_S)
    # Gone mid-handshake: the first bytes of a ClientHello, then a close.
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as s:
        s.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
    assert tls_ping(port, client_context(pki)) == b"+PONG\r\n"
    plain = redis.Redis(port=node.port, socket_timeout=WAIT_S, decode_responses=True)
    wait_for(
        lambda: int(info_field(plain, "stats", "tls_handshake_failures")) == 3,  # type: ignore[call-overload]
        what="three failed handshakes counted",
    )
    assert plain.ping()
    plain.close()


@pytest.mark.slow
def test_a_silent_connection_is_closed_after_the_handshake_timeout(
    node_factory: object, pki: Pki
) -> None:
    from disque_trio.server.tls import HANDSHAKE_TIMEOUT_S

    _, port = tls_node(node_factory, pki)
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as s:
        started = time.monotonic()
        assert closed_by_peer(s, HANDSHAKE_TIMEOUT_S + 5)
        assert time.monotonic() - started >= HANDSHAKE_TIMEOUT_S - 0.5
    assert tls_ping(port, client_context(pki)) == b"+PONG\r\n"


@pytest.fixture
def tls_only_node(tmp_path: Path, pki: Pki) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A node with `port 0`: the TLS port is its only client port."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "disque_trio", "--port", "0", "--tls-port", str(port),
            "--bind", "127.0.0.1", *pki.node_args(),
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 15
        while True:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            try:
                if tls_ping(port, client_context(pki)) == b"+PONG\r\n":
                    break
            except OSError:
                assert time.monotonic() < deadline, "the TLS-only node did not answer"
                time.sleep(0.05)
        yield proc, port
    finally:
        proc.kill()
        proc.wait(timeout=15)
        if proc.stdout is not None:
            proc.stdout.close()


def test_tls_only_node(tls_only_node: tuple[subprocess.Popen[bytes], int], pki: Pki) -> None:
    proc, port = tls_only_node
    r = tls_redis(port, pki)
    assert r.info("server")["tcp_port"] == port
    assert r.execute_command("HELLO")[2][2] == str(port)  # what other nodes and clients dial
    assert r.config_get("port") == {"port": "0"}
    # The bus and web ports derive from tls-port.
    with socket.create_connection(("127.0.0.1", port + 10000), timeout=WAIT_S):
        pass
    with socket.create_connection(("127.0.0.1", port + 1000), timeout=WAIT_S):
        pass
    r.close()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 0
    out = proc.stdout.read().decode() if proc.stdout else ""
    assert f"ready to accept connections on 127.0.0.1:{port} (TLS)" in out


# ----------------------------------------------------------- web port


def https_get(port: int, path: str, context: ssl.SSLContext) -> tuple[int, bytes]:
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=WAIT_S, context=context)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_web_port_over_https(node_factory: object, pki: Pki, tmp_path: Path) -> None:
    node: NodeProcess = node_factory(  # type: ignore[operator]
        "--tls-web", "yes", *pki.node_args(), "--requirepass", "pw"
    )
    web = node.port + 1000
    assert https_get(web, "/healthz", client_context(pki)) == (200, b"ok\n")
    assert https_get(web, "/metrics", client_context(pki))[0] == 401
    # Plain HTTP gets no answer: the connection is closed.
    with socket.create_connection(("127.0.0.1", web), timeout=WAIT_S) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert closed_by_peer(s, WAIT_S)
    # WSS through the ws subcommand (the system's default context, told
    # about the test CA by OpenSSL's SSL_CERT_FILE).
    result = subprocess.run(
        [sys.executable, "-m", "disque_trio", "ws", "--auth", "pw", f"wss://127.0.0.1:{web}/ws", "PING"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
        env={**os.environ, "SSL_CERT_FILE": pki.ca},
    )  # fmt: skip
    assert (result.returncode, result.stdout) == (0, "PONG\n"), result.stderr
    # The RESP port stays plain (no tls-port).
    assert redis.Redis(port=node.port, password="pw", socket_timeout=WAIT_S).ping()


# ----------------------------------------------------------- cluster bus


def test_cluster_over_tls_with_a_secret(node_factory: object, pki: Pki) -> None:
    tls_args = ("--tls-cluster", "yes", "--tls-ca-cert-file", pki.ca, *pki.node_args())
    nodes = start_cluster(node_factory, 3, *tls_args, "--cluster-secret", "bus-pw")
    for n in nodes:
        info = client(n).execute_command("CLUSTER", "INFO")
        assert "cluster_reachable_nodes:2" in info, info
        assert all(fields[5] == "connected" for fields in nodes_lines(n)[1:])
    first = client(nodes[0])
    job_id = first.execute_command("ADDJOB", "q", "replicated", 5000, "REPLICATE", 3)
    for n in nodes:
        assert client(n).execute_command("SHOW", job_id) is not None

    # The bus port speaks TLS, shows the node's certificate, and wants one.
    bus_port = nodes[0].port + 10000
    context = client_context(pki, "client")
    context.check_hostname = False
    with (
        socket.create_connection(("127.0.0.1", bus_port), timeout=WAIT_S) as raw,
        context.wrap_socket(raw) as s,
    ):
        assert s.getpeercert() is not None
    with socket.create_connection(("127.0.0.1", bus_port), timeout=WAIT_S) as raw:
        raw.sendall(b"\x00\x00\x00\x10plain bus frame!")
        assert closed_by_peer(raw, WAIT_S)

    # A node without TLS on its bus cannot join, secret or not.
    outsider: NodeProcess = node_factory("--cluster-secret", "bus-pw")  # type: ignore[operator]
    assert client(outsider).execute_command("CLUSTER", "MEET", "127.0.0.1", nodes[0].port) == "OK"
    time.sleep(1.5)
    assert len(nodes_lines(nodes[0])) == 3 and len(nodes_lines(outsider)) == 1
    # Nor a TLS node whose certificate another CA signed.
    stranger: NodeProcess = node_factory(  # type: ignore[operator]
        "--tls-cluster", "yes", "--tls-ca-cert-file", pki.ca,
        "--tls-cert-file", pki.path("stranger.crt"), "--tls-key-file", pki.path("stranger.key"),
        "--cluster-secret", "bus-pw",
    )  # fmt: skip
    assert client(stranger).execute_command("CLUSTER", "MEET", "127.0.0.1", nodes[0].port) == "OK"
    time.sleep(1.5)
    assert len(nodes_lines(nodes[0])) == 3 and len(nodes_lines(stranger)) == 1
    nodes[0].kill(signal.SIGTERM)
    log = nodes[0].output()
    assert "TLS bus link from 127.0.0.1 refused" in log, log


# ----------------------------------------------------------- start-up errors


CERT_AND_KEY = ["--tls-cert-file", "{pki}/node.crt", "--tls-key-file", "{pki}/node.key"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["--tls-cert-file", "{pki}/missing.crt", "--tls-key-file", "{pki}/node.key"],
            "Can't read tls-cert-file '{pki}/missing.crt': No such file or directory",
        ),
        (
            ["--tls-cert-file", "{pki}/node.crt", "--tls-key-file", "{pki}/client.key"],
            "tls-key-file '{pki}/client.key' is not the key of tls-cert-file '{pki}/node.crt'",
        ),
        (
            ["--tls-cert-file", "{pki}/node.crt", "--tls-key-file", "{pki}/node-enc.key"],
            "tls-key-file '{pki}/node-enc.key' is encrypted and tls-key-file-pass is not set",
        ),
        (["--tls-cert-file", "{pki}/node.crt"], "tls-port needs tls-key-file"),
        (
            ["--tls-auth-clients", "yes", *CERT_AND_KEY],
            "tls-auth-clients yes needs tls-ca-cert-file",
        ),
    ],
    ids=["missing-cert", "wrong-key", "encrypted-key", "no-key", "no-ca"],
)
def test_bad_tls_files_are_one_line(
    tmp_path: Path, pki: Pki, args: list[str], expected: str
) -> None:
    argv = ["--port", str(free_port()), "--tls-port", str(free_port())]
    argv += [a.format(pki=pki.dir) for a in args]
    line = one_error_line(run_cli(*argv, cwd=tmp_path))
    assert line.startswith("*** FATAL CONFIG ERROR *** " + expected.format(pki=pki.dir)), line


def test_encrypted_key_with_its_pass(node_factory: object, pki: Pki) -> None:
    tls_port = free_port()
    node_factory(  # type: ignore[operator]
        "--tls-port", str(tls_port), "--tls-cert-file", pki.cert,
        "--tls-key-file", pki.path("node-enc.key"), "--tls-key-file-pass", KEY_PASSWORD,
    )  # fmt: skip
    assert tls_ping(tls_port, client_context(pki)) == b"+PONG\r\n"


def test_tls_port_in_use_names_it(tmp_path: Path, pki: Pki) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        ports = ["--port", str(free_port()), "--tls-port", str(taken)]
        line = one_error_line(
            run_cli(*ports, "--bind", "127.0.0.1", *pki.node_args(), cwd=tmp_path)
        )
    assert f"TLS port {taken} is already in use on 127.0.0.1 (set tls-port to change it)" in line


def test_relative_tls_paths_are_relative_to_dir(tmp_path: Path, pki: Pki) -> None:
    data = tmp_path / "data"
    (data / "tls").mkdir(parents=True)
    for name in ("node.crt", "node.key"):
        shutil.copy(pki.path(name), data / "tls" / name)
    port, tls_port = free_port(), free_port()
    args = ["--port", str(port), "--bind", "127.0.0.1", "--dir", "data"]
    args += ["--tls-port", str(tls_port), "--tls-cert-file", "tls/node.crt"]
    node = NodeProcess(port, tmp_path, [*args, "--tls-key-file", "tls/node.key"])
    try:
        node.start()
        assert tls_ping(tls_port, client_context(pki)) == b"+PONG\r\n"
    finally:
        node.stop()
