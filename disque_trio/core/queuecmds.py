"""Queue commands: GETJOB, QLEN, QPEEK, QSTAT, QSCAN, PAUSE."""

from __future__ import annotations

from ..protocol.replies import NULL_ARRAY, SYNTAX_ERROR, Reply, ReplyError, Status
from . import clusterjobs as cj
from .args import option, parse_getjob, parse_int, text
from .jobcmds import ScanArgs, flat
from .node import Node, job_reply
from .queue import PAUSED_OUT, Pause
from .waiters import Waiter

LEAVING_ERROR = ReplyError(
    "LEAVING", "This node is leaving the cluster, please connect to a different one"
)


def getjob(node: Node, argv: list[bytes]) -> Reply | Waiter:
    """GETJOB [NOHANG] [TIMEOUT ms] [COUNT n] [WITHCOUNTERS] FROM q1 ... qN"""
    args = parse_getjob(argv)
    jobs = take_jobs(node, args.queues, args.count, args.withcounters)
    if jobs:
        return jobs
    if args.nohang:
        return NULL_ARRAY
    if node.leaving:
        raise LEAVING_ERROR
    # A client waits once on each queue, however many times it named it.
    waiter = Waiter(
        queues=tuple(dict.fromkeys(args.queues)),
        count=args.count,
        withcounters=args.withcounters,
        timeout_ms=args.timeout,
    )
    node.block(waiter)
    return waiter


def take_jobs(node: Node, queues: list[str], count: int, withcounters: bool) -> list[Reply]:
    """Pop up to ``count`` jobs, visiting the queues left to right, round robin."""
    out: list[Reply] = []
    while len(out) < count:
        before = len(out)
        for name in queues:
            q = node.queues.get(name)
            job = node.fetch(q) if q is not None and not q.pause & PAUSED_OUT else None
            if job is None:
                cj.need_jobs(node, name)
                continue
            node.stats.delivered_jobs += 1
            out.append(job_reply(job, withcounters))
            if len(out) == count:
                break
        if len(out) == before:
            break
    return out


def qlen(node: Node, argv: list[bytes]) -> Reply:
    """QLEN queue"""
    return node.queue_length(text(argv[1]))


def qpeek(node: Node, argv: list[bytes]) -> Reply:
    """QPEEK queue count: oldest first, or newest first for a negative count."""
    count = parse_int(argv[2])
    q = node.queues.get(text(argv[1]))
    if q is None or count == 0:
        return []
    ids = q.peek_ids(abs(count), newest_first=count < 0)
    return [job_reply(node.jobs[job_id], False) for job_id in ids]


def qstat(node: Node, argv: list[bytes]) -> Reply:
    """QSTAT queue: a flat key/value array, nil for an unknown queue."""
    q = node.queues.get(text(argv[1]))
    if q is None:
        return NULL_ARRAY
    return flat(q.stat(node.now_ms()))


def qscan(node: Node, argv: list[bytes]) -> Reply:
    """QSCAN [cursor] [COUNT n] [BUSYLOOP] [MINLEN n] [MAXLEN n] [IMPORTRATE r]"""
    scan = ScanArgs()
    filters = {b"minlen": -1, b"maxlen": -1, b"importrate": -1}
    i = 1
    while i < len(argv):
        opt = option(argv[i])
        if scan.take(opt, argv, i):
            i += 2 if opt == b"count" else 1
        elif opt in filters and i + 1 < len(argv):
            filters[opt] = parse_int(argv[i + 1])
            i += 2
        else:
            scan.set_cursor(argv[i])
            i += 1
    minlen, maxlen, rate = filters[b"minlen"], filters[b"maxlen"], filters[b"importrate"]
    now = node.now_ms()

    def match(name: str) -> bool:
        q = node.queues[name]
        if minlen != -1 and len(q.jobs) < minlen:
            return False
        if maxlen != -1 and len(q.jobs) > maxlen:
            return False
        return rate == -1 or q.import_rate(now) >= rate

    cursor, found = scan.run(node.queues, match, node.scan_snapshots, "queues")
    items: list[Reply] = list(found)
    return [str(cursor), items]


_PAUSE_OPTIONS = {b"none": Pause.NONE, b"in": Pause.IN, b"out": Pause.OUT, b"all": Pause.ALL}


def pause(node: Node, argv: list[bytes]) -> Reply:
    """PAUSE queue in|out|all|none|state|bcast ...: reply the resulting state."""
    name = text(argv[1])
    q = node.queues.get(name)
    new, update, bcast = Pause.NONE, False, False
    for arg in argv[2:]:
        opt = option(arg)
        if opt in _PAUSE_OPTIONS:
            flag = _PAUSE_OPTIONS[opt]
            new = Pause.NONE if flag == Pause.NONE else new | flag
            update = True
        elif opt == b"bcast":
            bcast = True
        elif opt != b"state":
            raise SYNTAX_ERROR
    # "is not None": an empty Queue is falsy (it has a __len__).
    state = (
        node.set_pause(name, new) if update else (Pause(q.pause) if q is not None else Pause.NONE)
    )
    if bcast:
        cj.broadcast_pause(node, name, state)
    return Status(state.label)
