#!/usr/bin/env python3
"""Three-node benchmark: the cost of replication and cross-node delivery.

Starts three disque-trio nodes (A, B, C) on free loopback ports, joins them
into a full mesh, then in the same run measures (see bench/README.md):

* ADDJOB throughput against node A with redis-benchmark (50 clients, -P 1):
  REPLICATE 1 (the baseline), REPLICATE 3 (synchronous) and REPLICATE 3 ASYNC;
* delivery latency of jobs produced on A at a fixed rate and consumed on B
  (they reach B only through federation: NEEDJOBS / YOURJOBS), with a
  consumer on A itself as the reference.

    python bench/bench_cluster.py            # full run (~2.5 min on 2 cores)
    python bench/bench_cluster.py --quick    # smoke run (< 60 s)
    python bench/bench_cluster.py --repeat 5 --json out.json

This is a benchmark that prints figures, not a test: it exits 0 even when a
target is missed (exit 1 only if the benchmark itself could not run).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import hiredis
from bench_single import (
    BODY,
    CLIENTS,
    HOST,
    BenchError,
    Server,
    arm_signals,
    bench_parser,
    bench_timeout,
    check,
    command,
    encode,
    free_port,
    guarded,
    median,
    paired_ratio,
    redis_benchmark,
    settle_repeat,
    with_disque_c,
)

NODE_NAMES = ("A", "B", "C")
MESH_TIMEOUT = 30.0  # seconds for every node to see the two others
SYNC_TARGET = 0.35  # REPLICATE 3 (sync) ops/s >= 0.35x the REPLICATE 1 figure
P99_TARGET_MS = 100.0  # cross-node delivery p99 at 1,000 jobs/s
GETJOB_TIMEOUT_MS = 1000
GETJOB_COUNT = 10
SOCKET_TIMEOUT = 10.0  # any single reply (GETJOB blocks at most 1 s)

# redis-benchmark request counts (ops/s is a rate: a count only sets how long
# a run lasts; REPLICATE 3 sync is ~5x slower, so it gets fewer requests).
SIZES: dict[str, dict[str, float]] = {
    "full": {
        "repl1": 50_000,
        "repl3_sync": 20_000,
        "repl3_async": 50_000,
        "rate": 1_000,  # jobs/s of the paced producer
        "warmup_s": 2.0,  # produced but left out of the latency figures
        "measure_s": 10.0,
        "drain_s": 5.0,  # after the producer stops, wait this long for the rest
    },
    "quick": {
        "repl1": 5_000,
        "repl3_sync": 3_000,
        "repl3_async": 5_000,
        "rate": 1_000,
        "warmup_s": 1.0,
        "measure_s": 4.0,
        "drain_s": 3.0,
    },
}

# (row label, redis-benchmark arguments, JSON key)
ADDJOB_VARIANTS = (
    ("ADDJOB bq 0123456789 0 REPLICATE 1", ["0", "REPLICATE", "1"], "repl1"),
    ("ADDJOB bq 0123456789 5000 REPLICATE 3", ["5000", "REPLICATE", "3"], "repl3_sync"),
    ("ADDJOB bq 0123456789 0 REPLICATE 3 ASYNC", ["0", "REPLICATE", "3", "ASYNC"], "repl3_async"),
)


# -------------------------------------------------------------------- cluster


def info_field(port: int, section: str, name: str) -> int:
    """One integer field of INFO <section>."""
    text = command(port, b"INFO", section.encode(), timeout=10)
    for line in text.decode().splitlines():
        key, _, value = line.partition(":")
        if key == name:
            return int(value)
    raise BenchError(f"INFO {section} of :{port} has no {name}")


class Cluster:
    """Three nodes on loopback, each in its own scratch directory (its own
    nodes.conf), stopped together in the end."""

    def __init__(self) -> None:
        self.root = tempfile.mkdtemp(prefix="bench-cluster-")
        self.nodes: dict[str, Server] = {}
        self.bus_ports: dict[str, int] = {}
        self.ids: dict[str, str] = {}  # node name -> node ID
        # What the nodes' logs said that deserves a look, printed at the end.
        self.log_notes: list[str] = []

    def start(self) -> None:
        ports: set[int] = set()
        while len(ports) < 2 * len(NODE_NAMES):
            ports.add(free_port())
        it = iter(sorted(ports))
        for name in NODE_NAMES:
            port, bus = next(it), next(it)
            workdir = os.path.join(self.root, name)
            os.mkdir(workdir)
            argv = [sys.executable, "-m", "disque_trio", "--port", str(port), "--bind", HOST]
            argv += ["--enable-debug-command", "local"]  # DEBUG FLUSHALL between runs
            argv += ["--cluster-port", str(bus), "--dir", workdir, "--loglevel", "notice"]
            # Server starts each node in its own session / process group.
            self.nodes[name] = Server(f"node-{name}", argv, port, workdir)
            self.bus_ports[name] = bus
        for name, srv in self.nodes.items():
            srv.wait_ready()
            self.ids[name] = command(srv.port, b"CLUSTER MYID").decode()

    def port(self, name: str) -> int:
        return self.nodes[name].port

    def meet(self) -> float:
        """A meets B and C (gossip introduces B and C); wait for a full mesh.
        Returns the seconds it took."""
        t0 = time.monotonic()
        a = self.port("A")
        for name in NODE_NAMES[1:]:
            reply = command(a, b"CLUSTER", b"MEET", HOST, self.port(name), self.bus_ports[name])
            if reply != b"OK":
                raise BenchError(f"CLUSTER MEET {name}: {reply!r}")
        self.wait_mesh(MESH_TIMEOUT, "after CLUSTER MEET")
        return time.monotonic() - t0

    def reachable(self) -> dict[str, int]:
        return {
            name: _cluster_info(srv.port).get("cluster_reachable_nodes", -1)
            for name, srv in self.nodes.items()
        }

    def wait_mesh(self, timeout: float, when: str) -> float:
        """Wait until every node reports cluster_reachable_nodes:2; returns
        the seconds waited. BenchError after `timeout`."""
        t0 = time.monotonic()
        want = len(NODE_NAMES) - 1
        seen: dict[str, int] = {}
        while time.monotonic() - t0 < timeout:
            self.check_alive()
            seen = self.reachable()
            if all(v == want for v in seen.values()):
                return time.monotonic() - t0
            time.sleep(0.1)
        raise BenchError(f"no full mesh {timeout:.0f} s {when}: reachable nodes {seen}")

    def flush(self) -> None:
        for srv in self.nodes.values():
            reply = command(srv.port, b"DEBUG FLUSHALL")
            if reply != b"OK":
                raise BenchError(f"DEBUG FLUSHALL on {srv.kind}: {reply!r}")

    def registered(self) -> dict[str, int]:
        return {
            name: info_field(srv.port, "jobs", "registered_jobs")
            for name, srv in self.nodes.items()
        }

    def settle(self, timeout: float = 10.0, still: float = 0.5) -> tuple[dict[str, int], bool]:
        """Wait until every node's registered_jobs stops moving (replication
        or GC still in flight); returns the counts and whether they settled."""
        deadline = time.monotonic() + timeout
        last = self.registered()
        since = time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.1)
            now = self.registered()
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= still:
                return last, True
        return last, False

    def name_ids(self, line: str) -> str:
        """'node 1a2b3c4d is now fail?' -> 'node 1a2b3c4d (C) is now fail?'."""
        for name, node_id in self.ids.items():
            line = line.replace(node_id[:8], f"{node_id[:8]} ({name})")
        return line

    def check_alive(self) -> None:
        for srv in self.nodes.values():
            srv.check_alive()

    def stop_all(self) -> None:
        for srv in reversed(list(self.nodes.values())):
            with contextlib.suppress(Exception):
                if srv.proc.poll() is None:
                    # Read before stopping: shutting down logs warnings of its own.
                    self.log_notes += [
                        f"{srv.kind}: {self.name_ids(line)}" for line in notable_lines(srv)
                    ]
                srv.stop()
                if srv.proc.returncode not in (0, -signal.SIGTERM):
                    self.log_notes.append(f"{srv.kind} exited with status {srv.proc.returncode}")
        self.nodes.clear()
        shutil.rmtree(self.root, ignore_errors=True)


def _cluster_info(port: int) -> dict[str, int]:
    text = command(port, b"CLUSTER", b"INFO", timeout=10).decode()
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        with contextlib.suppress(ValueError):
            out[key] = int(value)
    return out


def notable_lines(srv: Server) -> list[str]:
    """Errors and warnings (Server.notable_log_lines), plus peers changing
    state ("node 1a2b3c4d is now fail?"): a peer flagged under load is news."""
    lines = srv.notable_log_lines()
    try:
        with open(srv.log_path, "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return lines
    flags = [line for line in text.splitlines() if " is now " in line and "exit" not in line]
    return lines + [line for line in flags if line not in lines]


# ---------------------------------------------------------- blocking client


class Conn:
    """One blocking RESP connection (one per thread), every reply bounded by
    a socket timeout."""

    def __init__(self, port: int, timeout: float = SOCKET_TIMEOUT) -> None:
        self.sock = socket.create_connection((HOST, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = hiredis.Reader()

    def call(self, *args: bytes | str | int) -> Any:
        return self.pipeline([args])[0]

    def pipeline(self, commands: list[tuple[bytes | str | int, ...]]) -> list[Any]:
        """Send the commands in one write, then read their replies."""
        self.sock.sendall(b"".join(encode(*args) for args in commands))
        replies = []
        for args in commands:
            while (reply := self.reader.gets()) is False:
                data = self.sock.recv(1 << 16)
                if not data:
                    raise ConnectionError("the node closed the connection")
                self.reader.feed(data)
            if isinstance(reply, hiredis.ReplyError):
                raise BenchError(f"{args[0]!r}: -{reply}")
            replies.append(reply)
        return replies

    def close(self) -> None:
        self.sock.close()


@dataclass
class Produced:
    sent: int = 0
    t0_ns: int = 0  # the schedule's origin
    last_ns: int = 0  # send time of the last job
    max_lag_ms: float = 0.0  # worst lateness against the schedule
    ids: list[bytes] = field(default_factory=list)  # job ID of each sequence number
    error: str = ""


@dataclass
class Consumed:
    # (sequence number, send time ns, receive time ns) per delivered job
    got: list[tuple[int, int, int]] = field(default_factory=list)
    empty: int = 0  # GETJOB calls that timed out with nothing
    acked: int = 0
    error: str = ""


def producer(
    port: int, queue: bytes, rate: float, count: int, stop: threading.Event, out: Produced
) -> None:
    """ADDJOB <queue> "<seq> <monotonic_ns>" 0 REPLICATE 1, paced at `rate`
    jobs/s on one connection, one request in flight. A late job is sent at
    once (no skipping); the worst lateness is recorded."""
    try:
        conn = Conn(port)
        try:
            t0 = time.monotonic_ns()
            out.t0_ns = t0
            step = 1e9 / rate
            for i in range(count):
                if stop.is_set():
                    return
                due = t0 + int(i * step)
                late = time.monotonic_ns() - due
                if late < 0:
                    time.sleep(-late / 1e9)
                else:
                    out.max_lag_ms = max(out.max_lag_ms, late / 1e6)
                ts = time.monotonic_ns()
                job_id = conn.call(b"ADDJOB", queue, b"%d %d" % (i, ts), b"0", b"REPLICATE", b"1")
                out.ids.append(job_id)
                out.sent += 1
                out.last_ns = ts
        finally:
            conn.close()
    except Exception as e:  # reported by the main thread
        out.error = f"{type(e).__name__}: {e}"


def consumer(
    port: int,
    queue: bytes,
    ack: bytes,
    stop: threading.Event,
    out: Consumed,
    until: int | None = None,
    pipelined: bool = False,
) -> None:
    """GETJOB TIMEOUT 1000 COUNT 10 FROM <queue>, then ACKJOB (or FASTACK)
    the delivered IDs, one request at a time (like redis-py would), until
    `stop` is set or `until` jobs arrived. `pipelined`: send the ACK and the
    next GETJOB in one write instead."""
    getjob = (b"GETJOB", b"TIMEOUT", GETJOB_TIMEOUT_MS, b"COUNT", GETJOB_COUNT, b"FROM", queue)
    try:
        conn = Conn(port)
        pending: list[bytes] = []
        try:
            while not stop.is_set():
                if until is not None and len(out.got) >= until:
                    break
                if pending and pipelined:
                    acked, reply = conn.pipeline([(ack, *pending), getjob])
                    out.acked += acked
                else:
                    if pending:
                        out.acked += conn.call(ack, *pending)
                    reply = conn.call(*getjob)
                pending = []
                now = time.monotonic_ns()
                if reply is None:
                    out.empty += 1
                    continue
                for _queue, job_id, body in reply:
                    seq, ts = body.split()
                    out.got.append((int(seq), int(ts), now))
                    pending.append(job_id)
            if pending:
                out.acked += conn.call(ack, *pending)
        finally:
            conn.close()
    except Exception as e:
        out.error = f"{type(e).__name__}: {e}"


def start_thread(target: Any, *args: Any) -> threading.Thread:
    # Daemon: a Ctrl-C never waits for a blocked GETJOB (the socket timeout
    # bounds it anyway).
    t = threading.Thread(target=target, args=args, daemon=True)
    t.start()
    return t


def percentile(sorted_xs: list[float], p: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_xs:
        return float("nan")
    return sorted_xs[max(0, math.ceil(p / 100 * len(sorted_xs)) - 1)]


# ------------------------------------------------------------------- results


@dataclass
class ThroughputRow:
    test: str
    ops: float  # median ops/s
    ratio: float  # median of the per-repetition ratios to REPLICATE 1
    copies: float  # median copies per job held by the cluster after the run
    target: str = ""
    passed: bool | None = None
    samples: dict[str, list[float]] = field(default_factory=dict)


@dataclass
class DeliveryRow:
    test: str
    sent_rate: float
    delivered_rate: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    lost: int  # total over the repetitions
    duplicates: int
    target: str = ""
    passed: bool | None = None
    samples: list[dict[str, Any]] = field(default_factory=list)


def print_table(head: tuple[str, ...], lines: list[tuple[str, ...]]) -> None:
    widths = [max(len(x) for x in col) for col in zip(head, *lines, strict=True)]
    sep = "  "
    print(sep.join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
    print(sep.join("-" * w for w in widths))
    for line in lines:
        cells = [line[0].ljust(widths[0])]
        cells += [c.rjust(w) for c, w in zip(line[1:], widths[1:], strict=True)]
        print(sep.join(cells))


def result_cell(passed: bool | None) -> str:
    return "-" if passed is None else ("PASS" if passed else "MISS")


# ---------------------------------------------------------------- benchmarks


class Bench:
    def __init__(self, args: argparse.Namespace, cluster: Cluster) -> None:
        self.args = args
        self.cluster = cluster
        self.size = dict(SIZES["quick" if args.quick else "full"])
        self.repeat = args.repeat
        self.ack = b"FASTACK" if args.ack == "fastack" else b"ACKJOB"
        self.throughput: list[ThroughputRow] = []
        self.delivery_rows: list[DeliveryRow] = []
        self.cold: list[float | None] = []  # seconds, None = not within the bound
        self.notes: list[str] = []

    def log(self, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    def note(self, msg: str) -> None:
        self.log(f"  note: {msg}")
        self.notes.append(msg)

    def check_mesh(self, when: str) -> None:
        """After a heavy run: every node should still see the two others.
        If not, note it and wait (bounded) for the mesh to come back."""
        seen = self.cluster.reachable()
        if all(v == len(NODE_NAMES) - 1 for v in seen.values()):
            return
        waited = self.cluster.wait_mesh(MESH_TIMEOUT, when)
        self.note(f"{when}: reachable nodes {seen}, full mesh again after {waited:.1f} s")

    # ---- ADDJOB REPLICATE 1 / 3 / 3 ASYNC (redis-benchmark against node A)

    def replication(self) -> None:
        a = self.cluster.port("A")
        ops: dict[str, list[float]] = {key: [] for _, _, key in ADDJOB_VARIANTS}
        copies: dict[str, list[float]] = {key: [] for _, _, key in ADDJOB_VARIANTS}
        for i in range(self.repeat):
            for label, extra, key in ADDJOB_VARIANTS:
                n = int(self.size[key])
                self.cluster.flush()
                rate = redis_benchmark(
                    a, n, 1, ["ADDJOB", "bq", BODY.decode(), *extra], bench_timeout(n)
                )
                self.cluster.check_alive()
                # Replication (ASYNC) may still be in flight: wait for the
                # job counts to settle, then count the copies held.
                held, settled = self.cluster.settle()
                per_job = sum(held.values()) / n
                ops[key].append(rate)
                copies[key].append(per_job)
                self.log(
                    f"{label} #{i + 1}: {rate:,.0f} ops/s; jobs held A/B/C "
                    + "/".join(f"{held[x]:,}" for x in NODE_NAMES)
                    + f" ({per_job:.2f} copies per job)"
                )
                want = 1 if key == "repl1" else 3
                if held["A"] != n or abs(per_job - want) > 1e-9:
                    self.note(
                        f"{label} #{i + 1}: {n:,} jobs added, expected {want} copies of each, "
                        f"nodes hold A/B/C = "
                        + "/".join(f"{held[x]:,}" for x in NODE_NAMES)
                        + ("" if settled else " (still moving after 10 s)")
                    )
                self.check_mesh(f"after {label} #{i + 1}")
        base = ops["repl1"]
        for label, _, key in ADDJOB_VARIANTS:
            ratio = paired_ratio(ops[key], base)
            target, passed = "", None
            if key == "repl3_sync":
                target, passed = f">= {SYNC_TARGET}x", check(ratio, ">=", SYNC_TARGET)
            row = ThroughputRow(
                label,
                median(ops[key]),
                ratio,
                median(copies[key]),
                target,
                passed,
                {"ops_per_s": ops[key], "copies_per_job": copies[key]},
            )
            self.throughput.append(row)
            self.log(f"  => {label}: {row.ops:,.0f} ops/s, x{row.ratio:.3f} of REPLICATE 1")

    # ---- produce on A at a fixed rate, consume on B (federated) or on A

    def delivery_once(self, consumer_node: str, queue: bytes) -> dict[str, Any]:
        rate = self.size["rate"]
        warmup, measure, drain = (self.size[k] for k in ("warmup_s", "measure_s", "drain_s"))
        count = int(rate * (warmup + measure))
        skip = int(rate * warmup)  # jobs of the warm-up: delivered, not in the figures
        self.cluster.flush()
        stop = threading.Event()
        prod, cons = Produced(), Consumed()
        a, c = self.cluster.port("A"), self.cluster.port(consumer_node)
        try:
            tp = start_thread(producer, a, queue, rate, count, stop, prod)
            # The producer starts first (by 0.1 s): B's first NEEDJOBS then finds
            # jobs on A. A consumer that waits before any job exists is the
            # cold-start case, measured separately.
            time.sleep(0.1)
            tc = start_thread(
                consumer, c, queue, self.ack, stop, cons, None, self.args.pipeline_ack
            )
            tp.join(timeout=warmup + measure + 30)
            if tp.is_alive():
                raise BenchError("the producer did not finish in time")
            if prod.error:
                raise BenchError(f"producer: {prod.error}")
            deadline = time.monotonic() + drain
            while len(cons.got) < prod.sent and time.monotonic() < deadline:
                if cons.error:
                    break
                time.sleep(0.02)
        finally:
            stop.set()
        tc.join(timeout=SOCKET_TIMEOUT + 5)
        if tc.is_alive():
            raise BenchError("the consumer did not stop in time")
        if cons.error:
            raise BenchError(f"consumer: {cons.error}")
        self.cluster.check_alive()

        got = list(cons.got)
        seqs = [s for s, _, _ in got]
        unique = set(seqs)
        lost = prod.sent - len(unique)
        dups = len(seqs) - len(unique)
        lat = sorted((r - t) / 1e6 for s, t, r in got if s >= skip)
        hist: dict[int, int] = {}  # latency histogram, 10 ms bins (JSON only)
        for x in lat:
            hist[int(x // 10) * 10] = hist.get(int(x // 10) * 10, 0) + 1
        # Rates over the measured window: from the first measured send to the
        # last send. delivered/s counts the receipts inside that window.
        w0 = prod.t0_ns + int(skip * 1e9 / rate)
        w1 = prod.last_ns
        window = max((w1 - w0) / 1e9, 1e-9)
        sent_rate = (prod.sent - skip) / window
        delivered_rate = sum(1 for _, _, r in got if w0 <= r <= w1) / window
        first = min((r for _, _, r in got), default=None)
        sample = {
            "sent": prod.sent,
            "received": len(got),
            "lost": lost,
            "duplicates": dups,
            "measured": len(lat),
            "sent_per_s": sent_rate,
            "delivered_per_s": delivered_rate,
            "p50_ms": percentile(lat, 50),
            "p90_ms": percentile(lat, 90),
            "p99_ms": percentile(lat, 99),
            "max_ms": lat[-1] if lat else float("nan"),
            "over_100ms": sum(1 for x in lat if x > 100),
            "first_job_ms": (first - prod.t0_ns) / 1e6 if first is not None else None,
            "producer_max_lag_ms": prod.max_lag_ms,
            "empty_getjobs": cons.empty,
            "acked": cons.acked,
            "latency_hist_10ms": hist,
        }
        if lost:
            missing = [i for i in range(prod.sent) if i not in unique]
            where = self.locate([prod.ids[i] for i in missing])
            sample["lost_seqs"] = missing
            sample["lost_where"] = where
            self.note(
                f"consumer on {consumer_node}: {lost} of {prod.sent:,} jobs not delivered "
                f"within {drain:.0f} s of the last ADDJOB (added {missing[0] / rate:.2f}-"
                f"{missing[-1] / rate:.2f} s into the run); where they are: {where}"
            )
        if dups:
            self.note(f"consumer on {consumer_node}: {dups} jobs delivered twice")
        if prod.max_lag_ms > 50:
            self.note(
                f"consumer on {consumer_node}: the producer fell {prod.max_lag_ms:.0f} ms "
                "behind its schedule (ADDJOB on A was slow to answer)"
            )
        # Acked jobs should be gone everywhere once the acks are collected.
        held, settled = self.cluster.settle(timeout=5.0)
        sample["held_after"] = held
        if any(held.values()):
            self.note(
                f"consumer on {consumer_node}: jobs still registered A/B/C = "
                + "/".join(str(held[n]) for n in NODE_NAMES)
                + f" after every job was {'acked' if not lost else 'acked or lost'}"
                + ("" if settled else " (still moving)")
            )
        return sample

    def locate(self, ids: list[bytes], limit: int = 200) -> str:
        """Where undelivered jobs are: SHOW on every node, summarized as
        'A: active x34 (requeue in 290-299 s)'."""
        states: dict[str, list[int]] = {}
        for job_id in ids[:limit]:
            found = False
            for n in NODE_NAMES:
                job = command(self.cluster.port(n), b"SHOW", job_id)
                if job is None:
                    continue
                found = True
                d = dict(zip(job[::2], job[1::2], strict=False))
                key = f"{n}: {d.get(b'state', b'?').decode()}"
                states.setdefault(key, []).append(int(d.get(b"next-requeue-within", -1)))
            if not found:
                states.setdefault("nowhere", []).append(-1)
        parts = []
        for key, requeue in sorted(states.items()):
            text = f"{key} x{len(requeue)}"
            if min(requeue) >= 0:
                text += f" (requeue in {min(requeue) / 1000:.0f}-{max(requeue) / 1000:.0f} s)"
            parts.append(text)
        more = f" (first {limit} looked up)" if len(ids) > limit else ""
        return ", ".join(parts) + more

    def delivery(self) -> None:
        runs: dict[str, list[dict[str, Any]]] = {"B": [], "A": []}
        for i in range(self.repeat):
            for node in ("B", "A"):
                s = self.delivery_once(node, b"fq")
                runs[node].append(s)
                self.log(
                    f"produce on A, consume on {node} #{i + 1}: sent {s['sent_per_s']:,.0f}/s, "
                    f"delivered {s['delivered_per_s']:,.0f}/s, latency p50 {s['p50_ms']:.1f} "
                    f"p99 {s['p99_ms']:.1f} max {s['max_ms']:.1f} ms, "
                    f"{s['over_100ms']} over 100 ms, first job after {s['first_job_ms']:.0f} ms"
                )
                self.check_mesh(f"after the delivery run on {node} #{i + 1}")
        for node, label in (("B", "A -> B (federated)"), ("A", "A -> A (same node)")):
            ss = runs[node]
            p99 = median([s["p99_ms"] for s in ss])
            target, passed = "", None
            if node == "B":
                target = f"p99 < {P99_TARGET_MS:.0f} ms"
                passed = p99 < P99_TARGET_MS
            row = DeliveryRow(
                label,
                median([s["sent_per_s"] for s in ss]),
                median([s["delivered_per_s"] for s in ss]),
                median([s["p50_ms"] for s in ss]),
                p99,
                median([s["max_ms"] for s in ss]),
                sum(s["lost"] for s in ss),
                sum(s["duplicates"] for s in ss),
                target,
                passed,
                ss,
            )
            self.delivery_rows.append(row)

    def cold_start(self) -> None:
        """A consumer already blocked on B when the first job is added on A:
        how long until it gets it (NEEDJOBS broadcasts back off from 2 s)."""
        bound = 15.0
        for i in range(self.repeat):
            self.cluster.flush()
            stop = threading.Event()
            cons = Consumed()
            t = start_thread(consumer, self.cluster.port("B"), b"cq", self.ack, stop, cons, 1)
            try:
                time.sleep(0.5)
                ts = time.monotonic_ns()
                conn = Conn(self.cluster.port("A"))
                try:
                    conn.call(b"ADDJOB", b"cq", b"0 %d" % ts, b"0", b"REPLICATE", b"1")
                finally:
                    conn.close()
                deadline = time.monotonic() + bound
                while not cons.got and not cons.error and time.monotonic() < deadline:
                    time.sleep(0.01)
            finally:
                stop.set()
            t.join(timeout=SOCKET_TIMEOUT + 5)
            if cons.error:
                raise BenchError(f"cold-start consumer: {cons.error}")
            secs = (cons.got[0][2] - ts) / 1e9 if cons.got else None
            self.cold.append(secs)
            self.log(
                f"cold start #{i + 1}: job added on A 0.5 s after B's consumer blocked, "
                + (
                    f"delivered on B after {secs:.2f} s"
                    if secs is not None
                    else f"not within {bound:.0f} s"
                )
            )
            self.cluster.settle(timeout=5.0)

    def run(self) -> None:
        self.log("--- replication: redis-benchmark ADDJOB against node A")
        self.replication()
        self.log(f"--- delivery: produce on A at {self.size['rate']:,.0f} jobs/s")
        self.delivery()
        self.log("--- cold start: consumer on B blocked before the first job")
        self.cold_start()

    # ---- output

    def print_tables(self) -> None:
        if self.throughput:
            print(
                f"\n-- ADDJOB on node A: redis-benchmark -c {CLIENTS} -P 1, "
                f"median of {self.repeat} --"
            )
            head = ("test", "ops/s", "vs REPLICATE 1", "copies/job", "target", "result")
            print_table(
                head,
                [
                    (
                        r.test,
                        f"{r.ops:,.0f}",
                        f"x{r.ratio:.3f}",
                        f"{r.copies:.2f}",
                        r.target or "-",
                        result_cell(r.passed),
                    )
                    for r in self.throughput
                ],
            )
        if self.delivery_rows:
            s = self.size
            print(
                f"\n-- produce on A at {s['rate']:,.0f} jobs/s (REPLICATE 1) for "
                f"{s['warmup_s']:g}+{s['measure_s']:g} s, consume with GETJOB TIMEOUT "
                f"{GETJOB_TIMEOUT_MS} COUNT {GETJOB_COUNT} + {self.ack.decode()}"
                f"{' (pipelined)' if self.args.pipeline_ack else ''}; latency of the "
                f"last {s['measure_s']:g} s, median of {self.repeat} --"
            )
            head = (
                "produce -> consume",
                "sent/s",
                "delivered/s",
                "p50 ms",
                "p99 ms",
                "max ms",
                "lost",
                "dups",
                "target",
                "result",
            )
            print_table(
                head,
                [
                    (
                        r.test,
                        f"{r.sent_rate:,.0f}",
                        f"{r.delivered_rate:,.0f}",
                        f"{r.p50_ms:.1f}",
                        f"{r.p99_ms:.1f}",
                        f"{r.max_ms:.1f}",
                        str(r.lost),
                        str(r.duplicates),
                        r.target or "-",
                        result_cell(r.passed),
                    )
                    for r in self.delivery_rows
                ],
            )
        if self.cold:
            done = [x for x in self.cold if x is not None]
            text = ", ".join("> 15 s" if x is None else f"{x:.2f} s" for x in self.cold)
            med = f"median {median(done):.2f} s" if len(done) == len(self.cold) else "some never"
            print(
                f"\ncold start (consumer blocked on B first, one job added on A 0.5 s later): "
                f"delivered after {text} ({med})"
            )
        if self.notes:
            print("\nnotes:")
            print("\n".join(f"  {n}" for n in self.notes))


# --------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = bench_parser(__doc__, timeout=1200)
    p.add_argument(
        "--ack",
        choices=("ackjob", "fastack"),
        default="ackjob",
        help="how the delivery consumers acknowledge (default ackjob)",
    )
    p.add_argument(
        "--pipeline-ack",
        action="store_true",
        help="delivery consumers send the ACK and the next GETJOB in one write",
    )
    p.add_argument(
        "--disque-c",
        metavar="PATH",
        help="compare 3 nodes of disque-trio with 3 of the original C Disque (a "
        "disque-server you built): REPLICATE 3 throughput and latency, as bench_vs_c.py does",
    )
    return settle_repeat(p, p.parse_args(argv))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.disque_c:
        return with_disque_c(args, ["cluster"])
    if shutil.which("redis-benchmark") is None:
        print(
            "bench_cluster: redis-benchmark not found (apt-get install redis-tools)",
            file=sys.stderr,
        )
        return 1
    load_start = os.getloadavg()[0]
    rb_version = subprocess.run(
        ["redis-benchmark", "--version"], capture_output=True, text=True, timeout=10
    ).stdout.strip()
    print(
        f"bench_cluster: {'quick' if args.quick else 'full'} run, repeat {args.repeat}, "
        f"3 nodes, {os.cpu_count()} CPUs, Python {platform.python_version()}, {rb_version}"
    )
    if load_start > 0.5:
        print(
            f"warning: load average is {load_start:.2f} before the start: other processes "
            "compete for the CPUs, figures will be low and noisy"
        )
    arm_signals(args.timeout)
    cluster = Cluster()
    bench = Bench(args, cluster)
    print("sizes: " + ", ".join(f"{k}={v:,g}" for k, v in bench.size.items()), flush=True)
    t0 = time.perf_counter()
    mesh_s = None

    def run() -> None:
        nonlocal mesh_s
        cluster.start()
        mesh_s = cluster.meet()
        bench.log(
            "nodes "
            + ", ".join(
                f"{n} :{cluster.port(n)} (bus :{cluster.bus_ports[n]})" for n in NODE_NAMES
            )
            + f"; full mesh after {mesh_s:.1f} s"
        )
        bench.run()

    status = guarded("bench_cluster", run, cluster.stop_all)
    if bench.throughput or bench.delivery_rows:
        print(
            f"\n== disque-trio, 3-node cluster on loopback, median of {args.repeat} "
            f"({time.perf_counter() - t0:.0f} s) =="
        )
        bench.print_tables()
        if cluster.log_notes:
            print("\nnode log lines worth a look:")
            print("\n".join(f"  {line}" for line in cluster.log_notes[:50]))
        print(
            f"\nload average (1 min): {load_start:.2f} at start, {os.getloadavg()[0]:.2f} at end"
        )
    if args.json:
        doc = {
            "mode": "quick" if args.quick else "full",
            "repeat": args.repeat,
            "clients": CLIENTS,
            "ack": args.ack,
            "pipeline_ack": args.pipeline_ack,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "sizes": bench.size,
            "mesh_seconds": mesh_s,
            "loadavg_start": load_start,
            "complete": status == 0,
            "throughput": [asdict(r) for r in bench.throughput],
            "delivery": [asdict(r) for r in bench.delivery_rows],
            "cold_start_seconds": bench.cold,
            "notes": bench.notes,
            "node_log_notes": cluster.log_notes,
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
