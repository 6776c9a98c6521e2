"""A real node process, driven by the clients users have: redis-py (RESP2
and RESP3), pydisque, redis-cli and raw sockets."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from typing import Any

import pytest
import redis
from pydisque.client import Client as DisqueClient

from .conftest import NodeProcess


@pytest.mark.parametrize("protocol", [2, 3, None])
def test_redis_py_round_trip(node: NodeProcess, protocol: int | None) -> None:
    r = redis.Redis(port=node.port, protocol=protocol, socket_timeout=10)
    job_id = r.execute_command("ADDJOB", "q", b"\x00binary\r\n\xff", 0)
    assert len(job_id) == 40
    got = r.execute_command("GETJOB", "WITHCOUNTERS", "FROM", "q")
    assert got[0][:3] == [b"q", job_id, b"\x00binary\r\n\xff"]
    assert r.execute_command("ACKJOB", job_id) == 1
    assert r.execute_command("GETJOB", "NOHANG", "FROM", "q") is None
    assert r.ping() is True
    info = r.info()
    assert "disque_version" in info and "registered_jobs" in info
    assert r.client_getname() is None
    r.client_setname("worker-1")
    assert r.client_getname() in ("worker-1", b"worker-1")


def test_redis_py_errors_are_error_replies(node: NodeProcess) -> None:
    r = redis.Redis(port=node.port, socket_timeout=10)
    with pytest.raises(redis.ResponseError, match="BADID"):
        r.execute_command("SHOW", "nope")
    with pytest.raises(redis.ResponseError, match="unknown command"):
        r.execute_command("LPUSH", "x", "y")
    with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
        r.execute_command("ADDJOB", "q")
    with pytest.raises(redis.ResponseError, match="NOREPL"):
        r.execute_command("ADDJOB", "q", "b", 0, "REPLICATE", 2)
    assert r.ping()  # the connection stays usable


def test_pydisque(node: NodeProcess) -> None:
    client = DisqueClient([f"127.0.0.1:{node.port}"])
    client.connect()
    job_id = client.add_job("jobs", "payload", timeout=100)
    jobs = client.get_job(["jobs"], timeout=1000)
    assert [(q, j, body) for q, j, body in jobs] == [(b"jobs", job_id, b"payload")]
    client.ack_job(job_id)
    assert client.qlen("jobs") == 0
    stat = client.qstat("jobs", return_dict=True)
    assert stat[b"jobs-in"] == 1 and stat[b"jobs-out"] == 1
    assert client.hello()[1] == client.connected_node.node_id


def test_raw_socket_byte_by_byte(node: NodeProcess) -> None:
    request = b"*4\r\n$6\r\nADDJOB\r\n$1\r\nq\r\n$5\r\nhello\r\n$1\r\n0\r\n"
    with socket.create_connection(("127.0.0.1", node.port), timeout=10) as s:
        for i in range(len(request)):
            s.sendall(request[i : i + 1])
        reply = s.recv(100)
    assert reply.startswith(b"+D-") and reply.endswith(b"\r\n") and len(reply) == 43


def test_inline_commands_like_telnet(node: NodeProcess) -> None:
    with socket.create_connection(("127.0.0.1", node.port), timeout=10) as s:
        s.sendall(b'PING\r\nADDJOB q "two words" 0\r\nQLEN q\n')
        data = b""
        while data.count(b"\r\n") < 3:
            data += s.recv(1000)
    lines = data.split(b"\r\n")
    assert lines[0] == b"+PONG" and lines[1].startswith(b"+D-") and lines[2] == b":1"


def test_pipeline_replies_come_in_one_send(node: NodeProcess) -> None:
    n = 1000
    request = b"".join(
        b"*4\r\n$6\r\nADDJOB\r\n$1\r\np\r\n$1\r\nx\r\n$1\r\n0\r\n" for _ in range(n)
    )
    with socket.create_connection(("127.0.0.1", node.port), timeout=10) as s:
        s.sendall(request)
        data = b""
        while data.count(b"\r\n") < n:
            data += s.recv(65536)
    lines = data.split(b"\r\n")[:-1]
    assert len(lines) == n and all(line.startswith(b"+D-") for line in lines)


def test_malformed_input_closes_connection_only(node: NodeProcess) -> None:
    with socket.create_connection(("127.0.0.1", node.port), timeout=10) as bad:
        bad.sendall(b"*2\r\n$3\r\nfoo\r\n:12\r\n")
        assert bad.recv(200).startswith(b"-ERR Protocol error")
        assert bad.recv(200) == b""  # closed by the node
    assert redis.Redis(port=node.port).ping()


@pytest.mark.skipif(shutil.which("redis-cli") is None, reason="redis-cli not installed")
def test_redis_cli(node: NodeProcess) -> None:
    def cli(*args: str) -> str:
        out = subprocess.run(
            ["redis-cli", "-p", str(node.port), *args], capture_output=True, timeout=10, check=True
        )
        return out.stdout.decode().strip()

    job_id = cli("ADDJOB", "cliq", "hello", "0")
    assert job_id.startswith("D-")
    assert cli("QLEN", "cliq") == "1"
    assert "queued" in cli("SHOW", job_id)
    assert cli("PAUSE", "cliq", "in") == "in"
    assert cli("ADDJOB", "cliq", "x", "0").startswith("PAUSED")


def test_bulk_longer_than_proto_max_bulk_len_is_refused(node_factory: object) -> None:
    node = node_factory("--proto-max-bulk-len", "1mb")  # type: ignore[operator]
    with socket.create_connection(("127.0.0.1", node.port), timeout=10) as s:
        s.sendall(b"*3\r\n$6\r\nADDJOB\r\n$1\r\nq\r\n$2000000\r\n")
        assert s.recv(200) == b"-ERR Protocol error: invalid bulk length\r\n"
        assert s.recv(200) == b""


def test_debug_sleep_stops_the_whole_node(node_factory: Any) -> None:
    node = node_factory("--enable-debug-command", "local")
    sleeper = redis.Redis(port=node.port, socket_timeout=10)
    other = redis.Redis(port=node.port, socket_timeout=10)
    other.ping()
    with socket.create_connection(("127.0.0.1", node.port), timeout=10) as s:
        s.sendall(b"DEBUG SLEEP 0.5\r\n")
        time.sleep(0.05)
        started = time.monotonic()
        assert other.ping()
        waited = time.monotonic() - started
        assert s.recv(100) == b"+OK\r\n"
    assert waited >= 0.3  # PING had to wait for the sleep to end
    assert sleeper.ping()


GETJOB_USAGE = "GETJOB [NOHANG] [TIMEOUT ms] [COUNT n] [WITHCOUNTERS] FROM queue [queue ...]"


def test_getjob_argument_errors_through_redis_py(node: NodeProcess) -> None:
    """The original answers a bare "ERR syntax error" to the first four; the
    text now says what is missing and still starts the same. The rest are
    the original's answers, word for word (checked against disque 1.0-rc1)."""
    r = redis.Redis(port=node.port, socket_timeout=10)
    cases = [
        (["FROM"], f"syntax error: a queue name is needed after FROM ({GETJOB_USAGE})"),
        (
            ["NOHANG"],
            f"syntax error: FROM and at least one queue name are needed ({GETJOB_USAGE})",
        ),
        (["TIMEOUT"], f"syntax error: TIMEOUT needs a value ({GETJOB_USAGE})"),
        (["FOO", "FROM", "errq"], f"syntax error: unknown option 'FOO' ({GETJOB_USAGE})"),
        (["COUNT", 0, "FROM", "errq"], "COUNT must be a number greater than zero"),
        (["COUNT", -1, "FROM", "errq"], "COUNT must be a number greater than zero"),
        (["TIMEOUT", -1, "FROM", "errq"], "timeout is negative"),
        (["TIMEOUT", "1.5", "FROM", "errq"], "timeout is not an integer or out of range"),
    ]
    for words, message in cases:
        with pytest.raises(redis.ResponseError) as raised:
            r.execute_command("GETJOB", *words)
        assert str(raised.value) == message, words
    with pytest.raises(redis.ResponseError, match=r"^wrong number of arguments for 'getjob'"):
        r.execute_command("GETJOB")
    assert r.execute_command("QSTAT", "errq") is None  # refused: the queue was never made
    assert r.execute_command("INFO", "clients")  # the connection stays usable
    assert r.execute_command("GETJOB", "NOHANG", "FROM", "q") is None
    assert r.execute_command("GETJOB", "TIMEOUT", 1, "FROM", "q") is None


def test_getjob_from_without_queue_through_a_raw_socket(node: NodeProcess) -> None:
    """The exact line on the wire: the ERR code first, as in the original."""
    with socket.create_connection(("127.0.0.1", node.port), timeout=10) as s:
        s.sendall(b"*2\r\n$6\r\nGETJOB\r\n$4\r\nFROM\r\n")
        data = b""
        while not data.endswith(b"\r\n"):
            data += s.recv(1000)
    assert (
        data
        == f"-ERR syntax error: a queue name is needed after FROM ({GETJOB_USAGE})\r\n".encode()
    )


def test_addjob_retry_and_ttl_edges_through_redis_py(node: NodeProcess) -> None:
    """As the original answers (checked against disque 1.0-rc1): RETRY is not
    held to TTL; RETRY 0 needs REPLICATE 1, the default on a node alone."""
    r = redis.Redis(port=node.port, socket_timeout=10)
    for opts, ttl, retry in [
        (["RETRY", 100, "TTL", 10], 10, 100),  # RETRY > TTL: accepted as given
        (["RETRY", 10, "TTL", 10], 10, 10),  # RETRY == TTL
        (["TTL", 5], 5, 1),  # default RETRY with a small TTL: 1
        (["RETRY", 0], 86400, 0),
    ]:
        job_id = r.execute_command("ADDJOB", "edges", "b", 0, *opts)
        show = r.execute_command("SHOW", job_id)
        info = dict(zip(show[::2], show[1::2], strict=True))
        assert (info[b"ttl"], info[b"retry"]) == (ttl, retry), opts
    with pytest.raises(redis.ResponseError) as raised:
        r.execute_command("ADDJOB", "edges", "b", 0, "RETRY", 0, "REPLICATE", 2)
    assert str(raised.value) == (
        "With RETRY set to 0 please explicitly set  REPLICATE to 1 (at-most-once delivery)"
    )


@pytest.mark.skipif(shutil.which("redis-cli") is None, reason="redis-cli not installed")
def test_redis_cli_getjob_and_addjob_edges(node: NodeProcess) -> None:
    def cli(*args: str) -> str:
        out = subprocess.run(
            ["redis-cli", "-p", str(node.port), *args], capture_output=True, timeout=10, check=True
        )
        return out.stdout.decode().strip()

    assert cli("GETJOB", "FROM") == (
        f"ERR syntax error: a queue name is needed after FROM ({GETJOB_USAGE})"
    )
    assert (
        cli("GETJOB", "COUNT", "0", "FROM", "q") == "ERR COUNT must be a number greater than zero"
    )
    assert cli("GETJOB", "TIMEOUT", "-1", "FROM", "q") == "ERR timeout is negative"
    assert cli("ADDJOB", "q", "body", "0", "RETRY", "100", "TTL", "10").startswith("D-")
