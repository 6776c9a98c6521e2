"""Commands as data: the arguments to send, how to read the reply, and what
the shells need to know to route and retry them.

A ``Command[T]`` is built by one of the functions below (``addjob(...)``,
``getjob(...)``, ...). ``ClientProtocol`` encodes it and turns the reply
into a ``T`` with ``command.parse``; the shells look at ``idempotent``
(may it be sent again after a connection broke with it in flight?),
``job_ids``/``routed`` (send it to the node that created the job?) and
``block`` (how long the node may legitimately keep the reply back).

Nothing here does I/O. Replies may be RESP2 or RESP3 values as
``disque_trio.protocol.resp.ReplyReader`` decodes them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

from ..protocol.replies import NULL_ARRAY
from .errors import ProtocolViolationError
from .types import HelloInfo, Job, JobInfo, NodeInfo, QueueStats, ScanPage

__all__ = [
    "JOB_STATES",
    "OUTCOMES",
    "Arg",
    "Command",
    "ackjob",
    "addjob",
    "auth",
    "deljob",
    "dequeue",
    "enqueue",
    "fastack",
    "getjob",
    "hello",
    "hello_resp",
    "info",
    "jscan",
    "nack",
    "pause",
    "ping",
    "qlen",
    "qpeek",
    "qscan",
    "qstat",
    "raw",
    "show",
    "waitjob",
    "working",
]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
Arg = bytes | str | int | float

JOB_STATES = ("wait-repl", "active", "queued", "acked")


@dataclass(frozen=True, slots=True, eq=False)
class Command(Generic[T_co]):
    """One request and how to read its reply.

    ``idempotent``: sending it twice does no harm, so a shell may send it
    again when the connection broke after it was sent. (Any command may be
    sent again when it never left: a connection that could not be opened.)
    ``retry_codes``: error replies after which the node did nothing, so
    the command may be sent again elsewhere (ADDJOB's NOREPL).
    ``duplicates``: sent again after a connection lost with it in flight,
    it may take effect twice (ADDJOB with resend: a second job); the shells
    say so when they do, and check a reused connection before sending it.
    ``attempts``: how many times a shell may send it in all (None: the
    client's ``max_attempts``). ``routed``: the shells send it to the node
    named by its job IDs when that node is known (``job_ids``). ``block``:
    seconds the node may hold the reply back on purpose (GETJOB's
    TIMEOUT); ``None`` for no limit.
    """

    args: tuple[bytes, ...]
    parse: Callable[[object], T_co]
    idempotent: bool = True
    job_ids: tuple[str, ...] = ()
    routed: bool = False
    block: float | None = 0.0
    # Arguments after the IDs of a routed command (NACK's DELAY, WAITJOB's
    # TIMEOUT): every part of it split by node carries them.
    tail: tuple[bytes, ...] = ()
    retry_codes: tuple[str, ...] = ()
    attempts: int | None = None
    duplicates: bool = False

    @property
    def name(self) -> str:
        return self.args[0].decode("ascii", "replace").upper()

    def for_ids(self, ids: Sequence[str]) -> Command[T_co]:
        """The same command for a subset of its job IDs (routed commands
        only: their arguments are exactly the IDs, then ``tail``)."""
        assert self.routed
        args = (self.args[0], *(i.encode("ascii") for i in ids), *self.tail)
        return replace(self, args=args, job_ids=tuple(ids))


def _arg(value: Arg) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    if isinstance(value, bool):
        raise TypeError("a boolean is not a command argument")
    if isinstance(value, int):
        return b"%d" % value
    if isinstance(value, float):
        return repr(value).encode("ascii")
    raise TypeError(f"cannot send {type(value).__name__} as an argument")


def _args(*values: Arg) -> tuple[bytes, ...]:
    return tuple(_arg(v) for v in values)


# ------------------------------------------------------------ reply readers


def _fail(what: str, reply: object) -> ProtocolViolationError:
    return ProtocolViolationError(f"unexpected reply for {what}: {reply!r:.200}")


def _str(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    if isinstance(value, str):
        return str(value)
    raise _fail("a string", value)


def _bytes(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    raise _fail("bytes", value)


def _int(value: object) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, bytes | str):
        try:
            return int(value)
        except ValueError:
            pass
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise _fail("an integer", value)


def _opt_int(value: object) -> int | None:
    return None if value is None or value is NULL_ARRAY else _int(value)


def _list(value: object) -> list[object]:
    if isinstance(value, list | tuple):
        return list(value)
    raise _fail("an array", value)


def _str_list(value: object) -> list[str]:
    if value is None or value is NULL_ARRAY:
        return []
    if isinstance(value, bytes | str):  # QSTAT import-from printed as one word
        text = _str(value)
        return text.split() if text else []
    return [_str(v) for v in _list(value)]


def _pairs(value: object) -> dict[str, object]:
    """A flat [k, v, k, v...] array, or a RESP3 map, as a dict."""
    if isinstance(value, dict):
        return {_str(k): v for k, v in value.items()}
    items = _list(value)
    if len(items) % 2:
        raise _fail("a field/value array", value)
    return {_str(k): v for k, v in zip(items[::2], items[1::2], strict=True)}


def _is_nil(value: object) -> bool:
    return value is None or value is NULL_ARRAY


def parse_status(reply: object) -> str:
    return _str(reply)


def parse_int(reply: object) -> int:
    return _int(reply)


def parse_ok(reply: object) -> None:
    if _str(reply).upper() != "OK":
        raise _fail("OK", reply)


def parse_jobs(reply: object) -> list[Job]:
    """GETJOB and QPEEK: [queue, id, body] or, WITHCOUNTERS, [queue, id,
    body, "nacks", n, "additional-deliveries", n]; nil is no job."""
    if _is_nil(reply):
        return []
    jobs = []
    for entry in _list(reply):
        fields = _list(entry)
        if len(fields) < 3:
            raise _fail("a job", entry)
        counters = _pairs(fields[3:]) if len(fields) > 3 else {}
        jobs.append(
            Job(
                id=_str(fields[1]),
                queue=_str(fields[0]),
                body=_bytes(fields[2]),
                nacks=_int(counters.get("nacks", 0)),
                additional_deliveries=_int(counters.get("additional-deliveries", 0)),
            )
        )
    return jobs


_SHOW_FIELDS = {
    "id",
    "queue",
    "state",
    "repl",
    "ttl",
    "ctime",
    "delay",
    "retry",
    "nacks",
    "additional-deliveries",
    "nodes-delivered",
    "nodes-confirmed",
    "next-requeue-within",
    "next-awake-within",
    "body",
    "delayed-requeue",
}


def parse_job_info(reply: object) -> JobInfo | None:
    if _is_nil(reply):
        return None
    f = _pairs(reply)
    queue = f.get("queue")
    return JobInfo(
        id=_str(f["id"]),
        queue=None if _is_nil(queue) else _str(queue),
        state=_str(f.get("state", "")),
        repl=_int(f.get("repl", 0)),
        ttl=_int(f.get("ttl", 0)),
        ctime=_int(f.get("ctime", 0)),
        delay=_int(f.get("delay", 0)),
        retry=_int(f.get("retry", 0)),
        nacks=_int(f.get("nacks", 0)),
        additional_deliveries=_int(f.get("additional-deliveries", 0)),
        nodes_delivered=_str_list(f.get("nodes-delivered")),
        nodes_confirmed=_str_list(f.get("nodes-confirmed")),
        next_requeue_within=_opt_int(f.get("next-requeue-within")),
        next_awake_within=_opt_int(f.get("next-awake-within")),
        body=b"" if _is_nil(f.get("body")) else _bytes(f.get("body", b"")),
        delayed_requeue=bool(_int(f.get("delayed-requeue", 0))),
        extra={k: v for k, v in f.items() if k not in _SHOW_FIELDS},
    )


_QSTAT_FIELDS = {
    "name",
    "len",
    "age",
    "idle",
    "blocked",
    "import-from",
    "import-rate",
    "jobs-in",
    "jobs-out",
    "pause",
}


def parse_queue_stats(reply: object) -> QueueStats | None:
    if _is_nil(reply):
        return None
    f = _pairs(reply)
    return QueueStats(
        name=_str(f["name"]),
        len=_int(f.get("len", 0)),
        age=_int(f.get("age", 0)),
        idle=_int(f.get("idle", 0)),
        blocked=_int(f.get("blocked", 0)),
        import_from=_str_list(f.get("import-from")),
        import_rate=_int(f.get("import-rate", 0)),
        jobs_in=_int(f.get("jobs-in", 0)),
        jobs_out=_int(f.get("jobs-out", 0)),
        pause=_str(f.get("pause", "none")),
        extra={k: v for k, v in f.items() if k not in _QSTAT_FIELDS},
    )


def parse_hello(reply: object) -> HelloInfo:
    items = _list(reply)
    if len(items) < 2:
        raise _fail("HELLO", reply)
    nodes = []
    for entry in items[2:]:
        fields = _list(entry)
        if len(fields) < 4:
            raise _fail("a HELLO node", entry)
        nodes.append(
            NodeInfo(
                id=_str(fields[0]),
                host=_str(fields[1]),
                port=_int(fields[2]),
                priority=_int(fields[3]),
            )
        )
    return HelloInfo(version=_int(items[0]), node_id=_str(items[1]), nodes=nodes)


def _parse_scan(item: Callable[[object], T]) -> Callable[[object], ScanPage[T]]:
    def parse(reply: object) -> ScanPage[T]:
        parts = _list(reply)
        if len(parts) != 2:
            raise _fail("a scan page", reply)
        return ScanPage(cursor=_int(parts[0]), items=[item(v) for v in _list(parts[1])])

    return parse


def _job_info_item(value: object) -> JobInfo:
    info = parse_job_info(value)
    if info is None:
        raise _fail("a job", value)
    return info


def parse_info(reply: object) -> str:
    return _str(reply)


def parse_raw(reply: object) -> object:
    return reply


# ------------------------------------------------------------ the commands


def addjob(
    queue: str | bytes,
    body: bytes | str,
    timeout_ms: int = 0,
    *,
    replicate: int | None = None,
    delay: int | None = None,
    retry: int | None = None,
    ttl: int | None = None,
    maxlen: int | None = None,
    asynchronous: bool = False,
    resend: bool = False,
    attempts: int | None = None,
) -> Command[str]:
    """ADDJOB; the reply is the new job's ID. Sent again (up to
    ``attempts`` in all) after -NOREPL (the node deleted the copies it
    made) or a connection that could not be opened; after a connection
    lost with it in flight only with ``resend`` (the job may have been
    added: a second copy of it could be created)."""
    args: list[Arg] = ["ADDJOB", queue, body, timeout_ms]
    for name, value in (
        ("REPLICATE", replicate),
        ("DELAY", delay),
        ("RETRY", retry),
        ("TTL", ttl),
        ("MAXLEN", maxlen),
    ):
        if value is not None:
            args += [name, value]
    if asynchronous:
        args.append("ASYNC")
    # The node may wait up to ms-timeout for its copies (0: up to the TTL).
    block = None if timeout_ms == 0 and not asynchronous else timeout_ms / 1000
    return Command(
        _args(*args),
        parse_status,
        idempotent=resend,
        block=block,
        retry_codes=("NOREPL",),
        attempts=attempts,
        duplicates=resend,
    )


def getjob(
    queues: Iterable[str | bytes],
    *,
    count: int = 1,
    timeout_ms: int | None = None,
    nohang: bool = False,
    withcounters: bool = True,
) -> Command[list[Job]]:
    """GETJOB. ``timeout_ms`` None or 0 blocks until a job comes. A GETJOB
    sent twice after a lost reply is harmless (the job lost in transit is
    queued again after its RETRY), so it counts as idempotent."""
    names = list(queues)
    if not names:
        raise ValueError("GETJOB needs at least one queue")
    args: list[Arg] = ["GETJOB"]
    if nohang:
        args.append("NOHANG")
    if timeout_ms:
        args += ["TIMEOUT", timeout_ms]
    if count != 1:
        args += ["COUNT", count]
    if withcounters:
        args.append("WITHCOUNTERS")
    args += ["FROM", *names]
    block = 0.0 if nohang else (timeout_ms / 1000 if timeout_ms else None)
    return Command(_args(*args), parse_jobs, block=block)


def _job_command(
    name: str,
    ids: Sequence[str],
    parse: Callable[[object], T],
    *,
    idempotent: bool,
    tail: Sequence[Arg] = (),
    block: float | None = 0.0,
) -> Command[T]:
    rest = _args(*tail)
    return Command(
        (*_args(name, *ids), *rest),
        parse,
        idempotent=idempotent,
        job_ids=tuple(ids),
        routed=True,
        block=block,
        tail=rest,
    )


def _delay_tail(delay: float | None) -> list[Arg]:
    """NACK/ENQUEUE's ``DELAY seconds`` (whole seconds, rounded up)."""
    if delay is None or delay <= 0:
        return []
    return ["DELAY", math.ceil(delay)]


def ackjob(*ids: str) -> Command[int]:
    return _job_command("ACKJOB", ids, parse_int, idempotent=True)


def fastack(*ids: str) -> Command[int]:
    return _job_command("FASTACK", ids, parse_int, idempotent=True)


def nack(*ids: str, delay: float | None = None) -> Command[int]:
    """NACK counts a nack and queues the job (after ``delay`` seconds,
    rounded up to whole seconds): not sent twice."""
    return _job_command("NACK", ids, parse_int, idempotent=False, tail=_delay_tail(delay))


def working(job_id: str) -> Command[int]:
    return _job_command("WORKING", [job_id], parse_int, idempotent=True)


def show(job_id: str) -> Command[JobInfo | None]:
    return _job_command("SHOW", [job_id], parse_job_info, idempotent=True)


def enqueue(*ids: str, delay: float | None = None) -> Command[int]:
    """ENQUEUE (after ``delay`` seconds, rounded up): not sent twice."""
    args = _args("ENQUEUE", *ids, *_delay_tail(delay))
    return Command(args, parse_int, idempotent=False, job_ids=ids)


OUTCOMES = ("acked", "gone", "unknown", "pending")


def parse_outcomes(reply: object) -> list[str]:
    """WAITJOB: one of OUTCOMES per ID, in order."""
    outcomes = [_str(v) for v in _list(reply)]
    for outcome in outcomes:
        if outcome not in OUTCOMES:
            raise _fail("a WAITJOB outcome", reply)
    return outcomes


def waitjob(*ids: str, timeout_ms: int = 0) -> Command[list[str]]:
    """WAITJOB: blocks until each job is done (``timeout_ms`` 0: for
    ever). Harmless to send again."""
    if not ids:
        raise ValueError("WAITJOB needs at least one job ID")
    tail: list[Arg] = ["TIMEOUT", timeout_ms] if timeout_ms else []
    block = timeout_ms / 1000 if timeout_ms else None
    return _job_command("WAITJOB", ids, parse_outcomes, idempotent=True, tail=tail, block=block)


def dequeue(*ids: str) -> Command[int]:
    return Command(_args("DEQUEUE", *ids), parse_int, job_ids=ids)


def deljob(*ids: str) -> Command[int]:
    return Command(_args("DELJOB", *ids), parse_int, job_ids=ids)


def publish(channel: str | bytes, message: str | bytes) -> Command[int]:
    """PUBLISH: the clients of that node that received it. Not idempotent:
    sent again, it is received twice."""
    return Command(_args("PUBLISH", channel, message), parse_int, idempotent=False)


def qlen(queue: str | bytes) -> Command[int]:
    return Command(_args("QLEN", queue), parse_int)


def qstat(queue: str | bytes) -> Command[QueueStats | None]:
    return Command(_args("QSTAT", queue), parse_queue_stats)


def qpeek(queue: str | bytes, count: int) -> Command[list[Job]]:
    return Command(_args("QPEEK", queue, count), parse_jobs)


def pause(queue: str | bytes, *options: str) -> Command[str]:
    """PAUSE queue in|out|all|none|state|bcast...; the resulting state."""
    return Command(_args("PAUSE", queue, *options), parse_status)


def qscan(
    cursor: int = 0,
    *,
    count: int | None = None,
    busyloop: bool = False,
    minlen: int | None = None,
    maxlen: int | None = None,
    importrate: int | None = None,
) -> Command[ScanPage[str]]:
    args: list[Arg] = ["QSCAN", cursor]
    for name, value in (("COUNT", count), ("MINLEN", minlen), ("MAXLEN", maxlen)):
        if value is not None:
            args += [name, value]
    if importrate is not None:
        args += ["IMPORTRATE", importrate]
    if busyloop:
        args.append("BUSYLOOP")
    return Command(_args(*args), _parse_scan(_str))


def jscan(
    cursor: int = 0,
    *,
    count: int | None = None,
    busyloop: bool = False,
    queue: str | bytes | None = None,
    states: Sequence[str] = (),
) -> Command[ScanPage[str]]:
    """JSCAN ... REPLY id: a page of job IDs."""
    return Command(_jscan_args(cursor, count, busyloop, queue, states, "id"), _parse_scan(_str))


def jscan_all(
    cursor: int = 0,
    *,
    count: int | None = None,
    busyloop: bool = False,
    queue: str | bytes | None = None,
    states: Sequence[str] = (),
) -> Command[ScanPage[JobInfo]]:
    """JSCAN ... REPLY all: a page of jobs as SHOW describes them."""
    return Command(
        _jscan_args(cursor, count, busyloop, queue, states, "all"), _parse_scan(_job_info_item)
    )


def _jscan_args(
    cursor: int,
    count: int | None,
    busyloop: bool,
    queue: str | bytes | None,
    states: Sequence[str],
    reply: str,
) -> tuple[bytes, ...]:
    args: list[Arg] = ["JSCAN", cursor]
    if count is not None:
        args += ["COUNT", count]
    if busyloop:
        args.append("BUSYLOOP")
    if queue is not None:
        args += ["QUEUE", queue]
    for state in states:
        if state not in JOB_STATES:
            raise ValueError(f"unknown job state {state!r}; one of {', '.join(JOB_STATES)}")
        args += ["STATE", state]
    args += ["REPLY", reply]
    return _args(*args)


def hello() -> Command[HelloInfo]:
    """Disque's HELLO: the cluster as the node sees it."""
    return Command(_args("HELLO"), parse_hello)


def hello_resp(protover: int, password: str | None = None) -> Command[object]:
    """Redis' ``HELLO protover [AUTH default password]``: switches the
    connection to RESP2/RESP3 (disque-trio; the original has no such form)."""
    args: list[Arg] = ["HELLO", protover]
    if password is not None:
        args += ["AUTH", "default", password]
    return Command(_args(*args), parse_raw)


def auth(password: str) -> Command[None]:
    return Command(_args("AUTH", password), parse_ok)


def ping() -> Command[str]:
    return Command(_args("PING"), parse_status)


def info(section: str | None = None) -> Command[str]:
    return Command(_args("INFO", *([section] if section else [])), parse_info)


def raw(*args: Arg, idempotent: bool = False) -> Command[object]:
    """Any command; the reply as decoded (never sent twice unless said)."""
    if not args:
        raise ValueError("no command")
    return Command(_args(*args), parse_raw, idempotent=idempotent)


def block_seconds(command: Command[object]) -> float:
    """How long a call may wait on purpose, for timeouts: inf for no limit."""
    return math.inf if command.block is None else command.block
