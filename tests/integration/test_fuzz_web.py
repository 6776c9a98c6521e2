"""A fuzzer for the web port of one real node process: random HTTP requests
(methods, targets, headers, bodies; cut at random points, reset, sent a few
bytes at a time) and WebSocket sessions (random JSON, non-JSON, binary and
huge messages, malformed frames), many at once.

After every batch the node must answer PING on its RESP port within a
second and /healthz, with its RSS under ``RSS_LIMIT``; at the end its log
must hold no traceback (a bug a stranger can trigger is logged, at most
every 10 s, by the connection's boundary: this is where the fuzzer finds
them).

It runs for ``DISQUE_FUZZ_SECONDS`` (default 20); ``DISQUE_FUZZ_SEED``
replays a run (the seed is printed, and shown when the test fails):

    DISQUE_FUZZ_SECONDS=600 pytest tests/integration/test_fuzz_web.py -s
"""

from __future__ import annotations

import base64
import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import wsproto
import wsproto.events as wse
import wsproto.utilities

from ..helpers import free_port

pytestmark = pytest.mark.slow

FUZZ_SECONDS = float(os.environ.get("DISQUE_FUZZ_SECONDS", "20"))
RSS_LIMIT = 300 * 1024 * 1024
WORKERS = 12  # connections at once
BATCH_S = 2.0  # each worker starts new actions for this long, then checks
ACTION_S = 3.0  # the most one action may take
PING_S = 1.0

# The fuzzer's own side of a broken conversation.
CLIENT_ERRORS = (
    OSError,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
    wsproto.utilities.LocalProtocolError,
    wsproto.utilities.RemoteProtocolError,
)


class Node:
    """``python -m disque_trio`` with its log in a file (a pipe nobody reads
    would fill up and stop the node)."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.web = self.port + 1000
        self.log_path = workdir / "node.log"
        self.log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "disque_trio", "--port", str(self.port), "--bind", "127.0.0.1"],
            cwd=workdir,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        deadline = time.monotonic() + 15
        while True:
            assert self.proc.poll() is None, self.log_text()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64) == b"+PONG\r\n":
                        return
            except OSError:
                pass
            assert time.monotonic() < deadline, "the node did not start"
            time.sleep(0.05)

    def rss(self) -> int:
        with open(f"/proc/{self.proc.pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def log_text(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=15)
        self.log.close()


async def test_fuzz_the_web_port(tmp_path: Path) -> None:
    seed = int(os.environ.get("DISQUE_FUZZ_SEED") or random.randrange(1 << 32))
    print(f"DISQUE_FUZZ_SEED={seed}")
    rng = random.Random(seed)
    node = Node(tmp_path)
    done: Counter[str] = Counter()
    try:
        deadline = time.monotonic() + FUZZ_SECONDS
        batches = 0
        peak = 0
        while time.monotonic() < deadline:
            async with trio.open_nursery() as nursery:
                for _ in range(WORKERS):
                    worker_rng = random.Random(rng.getrandbits(64))
                    nursery.start_soon(worker, worker_rng, node.web, done)
            batches += 1
            assert node.proc.poll() is None, f"the node exited (seed {seed})\n{node.log_text()}"
            await ping_within(node.port, PING_S)
            await healthz(node.web)
            rss = node.rss()
            peak = max(peak, rss)
            assert rss < RSS_LIMIT, f"RSS {rss >> 20} MB after batch {batches} (seed {seed})"
        log = node.log_text()
        assert "Traceback" not in log and "unexpected error" not in log, (
            f"seed {seed}\n{log[-20000:]}"
        )
        print(
            f"{batches} batches, peak RSS {peak >> 20} MB, actions: {dict(sorted(done.items()))}"
        )
    finally:
        node.stop()


async def ping_within(port: int, seconds: float) -> None:
    with trio.fail_after(seconds):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(b"PING\r\n")
            assert await stream.receive_some(64) == b"+PONG\r\n"


async def healthz(port: int) -> None:
    with trio.fail_after(5):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            data = b""
            while not data.endswith(b"ok\n"):
                chunk = await stream.receive_some(4096)
                assert chunk, data
                data += chunk
            assert data.startswith(b"HTTP/1.1 200 ")


async def worker(rng: random.Random, port: int, done: Counter[str]) -> None:
    end = trio.current_time() + BATCH_S
    while trio.current_time() < end:
        name, action = rng.choices(ACTIONS, weights=[w for _, _, w in ACTIONS_WEIGHTED])[0]
        with trio.move_on_after(ACTION_S):
            try:
                await action(rng, port)
            except CLIENT_ERRORS:
                pass
        done[name] += 1


# ------------------------------------------------------------------ HTTP

METHODS = [b"GET"] * 6 + [
    b"HEAD",
    b"POST",
    b"PUT",
    b"DELETE",
    b"OPTIONS",
    b"PATCH",
    b"CONNECT",
    b"TRACE",
    b"get",
    b"G\x00T",
    b"",
    b"GET GET",
    b"\xff\xfe",
]
TARGETS = [
    b"/",
    b"/healthz",
    b"/metrics",
    b"/ws",
    b"/static/dashboard.js",
    b"/static/dashboard.css",
    b"/static/../web.py",
    b"/static/%2e%2e/web.py",
    b"/static/",
    b"/static//etc/passwd",
    b"/static/a\\b",
    b"/nope",
    b"*",
    b"http://127.0.0.1/healthz",
    b"http://[::1/x",
    b"//evil.example/",
    b"/?a=b#c",
    b"/\xff\xfe",
    b"/" + b"a" * 20000,
    b"",
]
VERSIONS = [b"HTTP/1.1"] * 8 + [b"HTTP/1.0", b"HTTP/2.0", b"HTTP/0.9", b"HTTP/1.1x", b""]
HOSTS = [
    "127.0.0.1:{port}",
    "localhost",
    "[::1]:{port}",
    "rebind.example:{port}",
    "[::1",
    "",
    "a b",
    "x:99999",
    "\xff\xfe",
]


def header_lines(rng: random.Random, port: int, body: bytes) -> tuple[list[bytes], bytes]:
    """Random header lines, and the body as it will be sent."""
    lines: list[bytes] = []
    if rng.random() < 0.9:
        lines.append(b"Host: " + rng.choice(HOSTS).format(port=port).encode("latin-1"))
    if rng.random() < 0.05:
        lines.append(b"Host: second.example")
    framing = rng.choice(["length", "length", "chunked", "none", "bad-length", "both"])
    if framing in ("length", "both"):
        lines.append(b"Content-Length: %d" % len(body))
    if framing == "bad-length":
        value = rng.choice([b"-1", b"abc", b"99999999999999999999", b"1, 2", b"", b"0x10"])
        lines.append(b"Content-Length: " + value)
    if framing in ("chunked", "both"):
        lines.append(b"Transfer-Encoding: " + rng.choice([b"chunked", b"gzip, chunked", b"bogus"]))
        body = chunked(rng, body)
    if rng.random() < 0.3:
        lines += [b"Upgrade: websocket", b"Connection: Upgrade", b"Sec-WebSocket-Version: 13"]
        key = rng.choice(
            [base64.b64encode(rng.randbytes(16)), b"!!", b"", base64.b64encode(rng.randbytes(5))]
        )
        lines.append(b"Sec-WebSocket-Key: " + key)
    for _ in range(rng.choice([0, 0, 1, 3, 10])):
        lines.append(random_header(rng))
    if rng.random() < 0.05:
        lines.append(b"X-Big: " + b"v" * rng.choice([8000, 17000, 70000]))
    rng.shuffle(lines)
    return lines, body


def random_header(rng: random.Random) -> bytes:
    choices = [
        b"Connection: " + rng.choice([b"close", b"keep-alive", b"Upgrade", b"x, close"]),
        b"Origin: "
        + rng.choice([b"http://evil.example", b"null", b"http://[::1", b"http://127.0.0.1"]),
        b"Authorization: "
        + rng.choice([b"Basic !!", b"Basic " + base64.b64encode(b"a:b"), b"Bearer x", b"Basic"]),
        b"Expect: 100-continue",
        b"Accept: */*",
        b" folded: continuation",
        b"X-" + rng.randbytes(rng.randrange(1, 20)) + b": " + rng.randbytes(rng.randrange(30)),
        b"no-colon-here",
        b": empty-name",
        b"X-Unicode: \xc3\xa9\xff",
    ]
    return rng.choice(choices)


def chunked(rng: random.Random, body: bytes) -> bytes:
    if rng.random() < 0.3:  # a broken chunk header
        return rng.choice([b"zz\r\n", b"fffffffffffffffffff\r\nab", b"-1\r\n", b"5\r\nabc"]) + body
    out = b""
    while body:
        n = rng.randrange(1, len(body) + 1)
        ext = rng.choice([b"", b"", b";name=value"])
        out += b"%x%s\r\n%s\r\n" % (n, ext, body[:n])
        body = body[n:]
    return out + b"0\r\n\r\n"


def random_request(rng: random.Random, port: int) -> bytes:
    method = rng.choice(METHODS)
    target = rng.choice(TARGETS)
    version = rng.choice(VERSIONS)
    body = rng.randbytes(rng.choice([0, 0, 0, 1, 10, 1000, 70000]))
    lines, body = header_lines(rng, port, body)
    head = b" ".join(p for p in (method, target, version) if p or rng.random() < 0.5)
    return head + b"\r\n" + b"".join(line + b"\r\n" for line in lines) + b"\r\n" + body


async def open_web(port: int) -> trio.SocketStream:
    return await trio.open_tcp_stream("127.0.0.1", port)


async def read_for(stream: trio.SocketStream, seconds: float) -> bytes:
    data = b""
    with trio.move_on_after(seconds):
        while len(data) < (1 << 22):
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            data += chunk
    return data


async def reset(stream: trio.SocketStream) -> None:
    """Close with a RST instead of a FIN."""
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    await stream.aclose()


async def http_whole(rng: random.Random, port: int) -> None:
    stream = await open_web(port)
    async with stream:
        count = rng.choice([1, 1, 1, 2, 4])  # pipelined
        await stream.send_all(b"".join(random_request(rng, port) for _ in range(count)))
        await read_for(stream, rng.choice([0.05, 0.3, 1.0]))


async def http_cut(rng: random.Random, port: int) -> None:
    """A request cut at a random point: closed, reset or half-closed."""
    request = random_request(rng, port)
    stream = await open_web(port)
    async with stream:
        await stream.send_all(request[: rng.randrange(len(request) + 1)])
        await trio.sleep(rng.choice([0, 0, 0.05, 0.3]))
        how = rng.choice(["close", "reset", "half"])
        if how == "reset":
            await reset(stream)
        elif how == "half":
            await stream.send_eof()
            await read_for(stream, 1.0)


async def http_slow(rng: random.Random, port: int) -> None:
    """Slow loris: a few bytes at a time, maybe never finishing."""
    request = random_request(rng, port)
    stream = await open_web(port)
    async with stream:
        stop = rng.randrange(len(request) + 1) if rng.random() < 0.5 else len(request)
        sent = 0
        while sent < stop:
            n = rng.randrange(1, 12)
            await stream.send_all(request[sent : min(stop, sent + n)])
            sent += n
            await trio.sleep(rng.uniform(0, 0.1))
        await read_for(stream, 0.5)


async def http_idle(rng: random.Random, port: int) -> None:
    stream = await open_web(port)
    async with stream:
        await trio.sleep(rng.uniform(0, 1))
        if rng.random() < 0.5:
            await reset(stream)


async def garbage(rng: random.Random, port: int) -> None:
    stream = await open_web(port)
    async with stream:
        data = rng.choice(
            [
                rng.randbytes(rng.randrange(1, 5000)),
                b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + rng.randbytes(200),  # TLS hello
                b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + rng.randbytes(50),  # HTTP/2 preface
                b"\r\n" * rng.randrange(1, 3000),
                b"PING\r\n*1\r\n$4\r\nPING\r\n",  # RESP on the wrong port
            ]
        )
        await stream.send_all(data)
        await read_for(stream, 0.2)


# ------------------------------------------------------------- WebSocket

COMMANDS = [
    "PING",
    "ADDJOB",
    "GETJOB",
    "ACKJOB",
    "FASTACK",
    "NACK",
    "WORKING",
    "SHOW",
    "DELJOB",
    "ENQUEUE",
    "DEQUEUE",
    "QLEN",
    "QSTAT",
    "QPEEK",
    "QSCAN",
    "JSCAN",
    "PAUSE",
    "INFO",
    "HELLO",
    "AUTH",
    "TIME",
    "COMMAND",
    "SLOWLOG",
    "LATENCY",
    "MONITOR",
    "QUIT",
    "CLIENT",
    "NOSUCHCOMMAND",
    "",
]
QUEUES = ["fq1", "fq2", "fq3", "f\u00e9", ""]
WORDS = [
    "FROM",
    "NOHANG",
    "TIMEOUT",
    "COUNT",
    "WITHCOUNTERS",
    "REPLICATE",
    "DELAY",
    "RETRY",
    "TTL",
    "MAXLEN",
    "ASYNC",
    "BUSYLOOP",
    "in",
    "out",
    "all",
    "none",
    "LIST",
    "ID",
    "GETNAME",
    "SETNAME",
    "GET",
    "RESET",
    "LEN",
    "-1",
    "0",
    "100",
    "9223372036854775808",
    "D-00000000-000000000000000000000000-0000",
]


def random_json(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 4 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, -1, 1.5, 10**30, -(10**400), 1e308, -0.0, 2**63])
    if kind == 3:
        return rng.choice(["", "x", "\u00e9\u2713", "\ud800", "\x00", "a" * 1000])
    if kind == 4:
        return {"base64": rng.choice(["AAEC", "!!", "", 5])}
    if kind == 5:
        return rng.choice(QUEUES + WORDS)
    if kind == 6:
        return [random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    keys = ["id", "cmd", "subscribe", "unsubscribe", "x", ""]
    return {rng.choice(keys): random_json(rng, depth + 1) for _ in range(rng.randrange(4))}


def random_message(rng: random.Random) -> str | bytes:
    kind = rng.randrange(10)
    request_id = rng.choice([1, "a", None, [1, {"x": 2}], 1.5, rng.randrange(1 << 62)])
    if kind <= 3:
        cmd: list[Any] = [rng.choice(COMMANDS)]
        cmd += [rng.choice([*QUEUES, *WORDS, rng.randrange(-5, 5000)]) for _ in range(6)][
            : rng.randrange(7)
        ]
        if cmd[0] == "ADDJOB":
            cmd = ["ADDJOB", rng.choice(QUEUES), "body", rng.choice([0, 0, 100, -1]), *cmd[1:3]]
        return json.dumps({"id": request_id, "cmd": cmd})
    if kind == 4:
        topics = rng.choice([["stats"], ["nodes"], ["jobs:fq1"], ["weather"], [], [1], "stats"])
        verb = rng.choice(["subscribe", "unsubscribe"])
        return json.dumps({"id": request_id, verb: topics})
    if kind == 5:
        return json.dumps(random_json(rng))
    if kind == 6:
        return rng.choice(
            [
                "{",
                "not json",
                "",
                "[" * 5000,
                "NaN",
                '{"id": Infinity}',
                '{"id": 1e400, "cmd": ["PING"]}',
                '{"id": "\\udfff", "cmd": ["PING", "\\ud800"]}',
                "\x00",
            ]
        )
    if kind == 7:
        return rng.randbytes(rng.randrange(100))
    if kind == 8:
        size = rng.choice([1 << 16, (1 << 20) - 100, (1 << 20) + 100])
        return json.dumps({"id": 1, "cmd": ["PING", "x" * size]})
    nested = rng.choice([100, 900, 5000])
    return '{"id": ' + "[" * nested + "]" * nested + ', "cmd": ["PING"]}'


class WsClient:
    """A WebSocket client on wsproto, with nothing hidden: it may send any
    bytes after the handshake, and its socket always closes."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
        self.closed = False

    async def handshake(self, port: int, rng: random.Random) -> bool:
        extra = []
        if rng.random() < 0.2:
            extra.append(
                ("Origin", rng.choice(["http://evil.example", f"http://127.0.0.1:{port}"]))
            )
        request = wse.Request(host=f"127.0.0.1:{port}", target="/ws", extra_headers=extra)
        await self.stream.send_all(self.ws.send(request))
        while True:
            for event in await self.events(2.0):
                if isinstance(event, wse.AcceptConnection):
                    return True
                if isinstance(event, wse.RejectConnection):
                    return False
            if self.closed:
                return False

    async def events(self, seconds: float) -> list[wse.Event]:
        """What arrived within ``seconds`` (answering pings and closes)."""
        with trio.move_on_after(seconds):
            data = await self.stream.receive_some(1 << 20)
            self.ws.receive_data(data or None)
            if not data:
                self.closed = True
        events = list(self.ws.events())
        for event in events:
            if isinstance(event, wse.Ping):
                await self.stream.send_all(self.ws.send(event.response()))
            elif isinstance(event, wse.CloseConnection):
                self.closed = True
        return events

    async def send(self, message: str | bytes) -> None:
        if isinstance(message, str):
            await self.stream.send_all(self.ws.send(wse.Message(data=message)))
        else:
            await self.stream.send_all(self.ws.send(wse.BytesMessage(data=message)))


def raw_frame(rng: random.Random) -> bytes:
    """A frame the protocol forbids, or bytes that are not a frame."""
    opcode = rng.choice([0x0, 0x1, 0x2, 0x3, 0x7, 0x8, 0x9, 0xA, 0xB, 0xF])
    payload = rng.choice([b"", b"x", b"\xff\xfe", b"\x03", b"\x03\xe7bad", rng.randbytes(200)])
    fin = rng.random() < 0.7
    rsv = rng.choice([0, 0, 0x40, 0x20, 0x10])
    masked = rng.random() < 0.8
    first = (0x80 if fin else 0) | rsv | opcode
    length = len(payload)
    if rng.random() < 0.1:
        header = bytes([first, (0x80 if masked else 0) | 127]) + struct.pack(
            "!Q", rng.choice([(1 << 63) - 1, 1 << 40, (1 << 64) - 1])
        )
    elif length < 126:
        header = bytes([first, (0x80 if masked else 0) | length])
    else:
        header = bytes([first, (0x80 if masked else 0) | 126]) + struct.pack("!H", length)
    if masked:
        mask = rng.randbytes(4)
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        header += mask
    frame = header + payload
    if rng.random() < 0.1:
        frame = rng.randbytes(rng.randrange(1, 50))
    return frame


async def ws_session(rng: random.Random, port: int) -> None:
    stream = await open_web(port)
    async with stream:
        client = WsClient(stream)
        if not await client.handshake(port, rng):
            return
        for _ in range(rng.randrange(1, 25)):
            if client.closed:
                return
            if rng.random() < 0.08:
                await stream.send_all(raw_frame(rng))
                await client.events(0.05)
                return  # the stream is no longer in step with wsproto
            if rng.random() < 0.1:
                await stream.send_all(client.ws.send(wse.Ping(payload=rng.randbytes(4))))
            await client.send(random_message(rng))
            await client.events(rng.choice([0, 0.01, 0.1]))
        if rng.random() < 0.5:
            await stream.send_all(client.ws.send(wse.CloseConnection(code=1000)))
            await client.events(0.3)
        elif rng.random() < 0.5:
            await reset(stream)


async def ws_slow_reader(rng: random.Random, port: int) -> None:
    """Subscribes to everything and sends commands, reading nothing."""
    stream = await open_web(port)
    async with stream:
        client = WsClient(stream)
        if not await client.handshake(port, rng):
            return
        await client.send(json.dumps({"id": 0, "subscribe": ["stats", "nodes", "jobs:fq1"]}))
        for i in range(rng.randrange(50, 400)):
            await client.send(json.dumps({"id": i, "cmd": ["ADDJOB", "fq1", "b", 0, "TTL", 5]}))
        await trio.sleep(rng.uniform(0, 1.5))


Action = Callable[[random.Random, int], Awaitable[None]]
ACTIONS_WEIGHTED: list[tuple[str, Action, int]] = [
    ("http", http_whole, 30),
    ("http-cut", http_cut, 20),
    ("http-slow", http_slow, 5),
    ("http-idle", http_idle, 3),
    ("garbage", garbage, 5),
    ("ws", ws_session, 30),
    ("ws-slow-reader", ws_slow_reader, 3),
]
ACTIONS: list[tuple[str, Action]] = [(name, action) for name, action, _ in ACTIONS_WEIGHTED]
