"""The cluster bus: messages between nodes, and their framing. No I/O.

Theory of operation
-------------------

Nodes talk over TCP links, one byte stream each. Every message is a
*frame*: a 4-byte big-endian length, then that many bytes of msgpack holding
the array ``[type_code, body]``. ``type_code`` is the original Disque's
``CLUSTERMSG_TYPE_*`` number (PING=0 ... PAUSE=15, see ``MsgType``) so that
cluster.c stays a cross-reference; HANDSHAKE (100) and AUTH (101) are ours:
the handshake is the first frame each side sends on a new link, and says who
is talking, where its client and bus ports are, which protocol version it
offers (the connector) or accepts (the acceptor: the highest both speak),
and a fresh random nonce; AUTH then proves, in both directions, that
the sender knows the cluster secret (see ``handshake_proof``). BATCH (102),
ours too, carries several messages of one small job-ID type (QUEUED,
WILLQUEUE, GOTJOB...) in one frame, ``[102, [type_code, [body, ...]]]``;
the receiver handles them one by one, in order, as if they came as frames
of their own (see ``encode_batch``). POSTPONE (103), ours, tells a job's
holders that the sender queues it after a client's delay (NACK or ENQUEUE
with DELAY: a message the original never had). GETSTATS/NODESTATS and
FINDJOB/JOBCOPY (104-107, ours, version 5) ask a node for its figures and
for its copy of a job, for a dashboard that shows the whole cluster.
REFUSED (108, ours, version 6) tells a job's holders that its ADDJOB was
answered -NOREPL, where the original sends DELJOB. HAVEJOBS (109, ours,
version 8) tells a node that asked for jobs of a queue (NEEDJOBS) that
the sender now has some: it asks again at once instead of after its
broadcast back-off. DELIVERED (110, ours, version 8) tells a job's other
holders that the sender handed it to a consumer: no fail-over for it, and
no re-queue before RETRY from then (a cheaper WORKING, sent for every
delivery). PUBLISH (111, ours, version 9) carries a client's PUBLISH to
the subscribers of every other node (at most once: a node that is not
linked misses it). NODEFIGURES (112, ours, version 10) answers GETSTATS
on a link of version 10 or later: NODESTATS's figures, and what lets the
asker count jobs rather than copies and show the jobs that wait to be
queued again (server/jobcensus.py). ``body`` is
the message's attrs fields as a positional array, nested classes as nested
arrays. Field names are not on the wire, so adding, removing or reordering a
field changes the protocol: bump ``PROTOCOL_VERSION`` when doing so.

Why a length prefix when msgpack delimits itself: the receiver learns how
big a frame is before buffering it, so a corrupt or hostile length is refused
at once (``max_frame``) instead of after gigabytes have arrived, and a frame
is decoded in one C call once complete, never re-parsed as bytes trickle in.

Why msgpack: compact, a fast C implementation, and it keeps ``bytes`` (bin)
apart from text and integers apart from everything else, so the decoder can
be strict about types. Why cattrs: the messages are declared once, as frozen
attrs classes, and one converter maps every one of them to and from plain
msgpack values. The converter is configured here to be strict, because
cattrs' defaults are lenient (``int("7")``, a tuple built from any iterable):

* integers must be msgpack integers (not bools, floats or strings) and are
  never negative; nothing on this bus counts below zero. None is above
  2**63-1, a job's TTL, DELAY and RETRY fit in 32 bits (protocol/limits.py),
  ports in 16 bits.
* every ``str`` travels as msgpack *bin*: UTF-8 with ``surrogateescape``.
  Queue names are whatever bytes a client sent, decoded with surrogateescape,
  so this makes them round-trip exactly; IPs, node IDs and job IDs are ASCII
  and cost nothing extra. A msgpack str where bin is expected is an error.
* node IDs are 40 lowercase hex digits, job IDs 40 ASCII characters.
* arrays must have exactly the length the class has fields.

Decoding trusts nothing: any bytes either give messages, ``None`` (need more
bytes) or ``BusError``, and after a ``BusError`` the decoder keeps raising
it, since the link is to be closed. Encoding trusts its caller (the
type-checked core) and checks only what msgpack and the frame size impose;
a value the peer would refuse (a negative count, a malformed node ID) is the
sender's bug, caught by the peer, which then drops the link.

What a message carries follows the original (cluster.h, cluster.c, and
``serializeJob`` in job.c), with Python types: see each class.

Speed: the checks cost little because each message class gets a hook
generated from its fields (see "Generated hooks" below), which tests every
leaf inline and builds the message in one call; the field-by-field hooks
run only to word the error of a frame it refuses. CPython 3.11.7, msgpack
1.2.4, cattrs 26.2, best of 7 on a shared 2-core VM, two runs each of the
earlier closure-based hooks and of the generated ones, alternating
(``python bench/bench_codecs.py --only bus`` re-measures)::

                                     before              generated
    REPLJOB, 10-byte body, 3 nodes   encode 8.3-8.7 us   encode 3.0-3.8 us
                                     decode 10.8-11.7    decode 6.4-6.9
    GOTJOB                           encode 1.7-3.0      encode 1.8-2.3
                                     decode 3.3          decode 2.7-3.8
    PING, 3 gossip entries           encode 9.4-13.1     encode 3.5-3.6
                                     decode 15.6-22.3    decode 9.9-10.1

What is left of a PING's decode is mostly msgpack and the frozen attrs
classes' constructors (three gossip entries and the message).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import linecache
from collections.abc import Callable
from types import MappingProxyType
from typing import Annotated, Any, ClassVar, Final, TypeAlias, get_args, get_origin

import attrs
import cattrs
import msgpack

from .limits import MAX_INT64, MAX_JOB_SECONDS

__all__ = [
    "BATCHABLE",
    "BATCH_MAX",
    "FIGURES_VERSION",
    "FLAG_INCR_DELIV",
    "FLAG_INCR_NACKS",
    "FLAG_RELAYED",
    "HANDSHAKE_MAX_FRAME",
    "HAVEJOBS_VERSION",
    "INCARNATION_BITS",
    "INCARNATION_SHIFT",
    "MAX_FRAME",
    "MAX_FRAME_LIMIT",
    "MIN_PROTOCOL_VERSION",
    "NODE_FLAG_FAIL",
    "NODE_FLAG_LEAVING",
    "NODE_FLAG_PFAIL",
    "NONCE_LEN",
    "PROTOCOL_VERSION",
    "PUBLISH_VERSION",
    "RELAY_VERSION",
    "SINCE_VERSION",
    "VERSION_FLAGS_VERSION",
    "VERSION_SHIFT",
    "Auth",
    "BusError",
    "DelJob",
    "Delivered",
    "Enqueue",
    "Fail",
    "FindJob",
    "FrameDecoder",
    "GetStats",
    "GossipEntry",
    "GotAck",
    "GotJob",
    "Handshake",
    "HaveJobs",
    "Heartbeat",
    "JobCopy",
    "JobData",
    "JobId",
    "Meet",
    "Message",
    "MsgType",
    "NeedJobs",
    "NodeFigures",
    "NodeId",
    "NodeStats",
    "Pause",
    "Ping",
    "Pong",
    "Port",
    "Postpone",
    "Publish",
    "QueueLength",
    "QueueRequeue",
    "Queued",
    "Refused",
    "ReplJob",
    "Seconds",
    "SetAck",
    "WillQueue",
    "Working",
    "YourJobs",
    "encode_batch",
    "encode_frame",
    "handshake_proof",
    "negotiate",
]

# The bus protocol versions this node speaks, MIN_PROTOCOL_VERSION to
# PROTOCOL_VERSION (3: BATCH frames; 4: POSTPONE; 5: GETSTATS, NODESTATS,
# FINDJOB, JOBCOPY for the cluster dashboard; 6: REFUSED; 7: a POSTPONE
# relayed by a holder, FLAG_RELAYED; 8: HAVEJOBS, DELIVERED, and the
# sender's incarnation in a heartbeat's flags; 9: PUBLISH; 10: NODEFIGURES).
# Two nodes speak the highest both know (``negotiate``): a cluster is
# upgraded node by node.
PROTOCOL_VERSION: Final = 10
MIN_PROTOCOL_VERSION: Final = 3
MAX_FRAME: Final = 64 * 1024 * 1024


def negotiate(theirs: int, mine: int = PROTOCOL_VERSION) -> int | None:
    """The version a link speaks when one side offers ``theirs`` and the
    other speaks up to ``mine``; None when they share none."""
    version = min(theirs, mine)
    return version if version >= MIN_PROTOCOL_VERSION else None


# Until a link is authenticated its frames are tiny: a handshake and a proof.
HANDSHAKE_MAX_FRAME: Final = 4096
NONCE_LEN: Final = 16
# The length prefix is 4 bytes. A prefix with its top bit set is a negative
# int32 to a C peer and is most likely garbage: capping max_frame below 2 GiB
# guarantees such a length is always refused.
MAX_FRAME_LIMIT: Final = 2**31 - 1
_HEADER_LEN: Final = 4

# QUEUED message flags (the original's CLUSTERMSG_FLAG0_*): the receiver
# bumps its copy's counters so that NACK and delivery counts survive
# re-queueing on another node.
FLAG_INCR_NACKS: Final = 1 << 1
FLAG_INCR_DELIV: Final = 1 << 2
# A POSTPONE flag: a holder passes on a POSTPONE its sender sent it to the
# holders the sender may not know of (protocol 7 and later, RELAY_VERSION);
# it counts nothing and is not passed on again.
FLAG_RELAYED: Final = 1 << 3
RELAY_VERSION: Final = 7

# The node flags a receiver acts on, with the original's bit values
# (CLUSTER_NODE_* in cluster.h); other bits are the sender's business.
NODE_FLAG_PFAIL: Final = 1 << 0  # suspected: did not answer pings in time
NODE_FLAG_FAIL: Final = 1 << 1  # failure agreed by enough nodes
NODE_FLAG_LEAVING: Final = 1 << 7  # CLUSTER LEAVING yes: replicate nothing to it
# A heartbeat's own flags carry, from bit 16, the highest bus protocol
# version the sender speaks (0 from releases before version 4, which
# ignore these bits): a link that speaks less is re-opened to speak more.
VERSION_SHIFT: Final = 16
VERSION_FLAGS_VERSION: Final = 4
# And from bit 24, INCARNATION_BITS of a random number the sender drew when
# it started (0 from releases before version 8, which ignore these bits too):
# another number from the same node ID means its process restarted.
INCARNATION_SHIFT: Final = 24
INCARNATION_BITS: Final = 32
HAVEJOBS_VERSION: Final = 8
PUBLISH_VERSION: Final = 9
FIGURES_VERSION: Final = 10

# The shapes core/ids.py makes (protocol/ imports nothing of the node).
_NODE_ID_LEN: Final = 40
_NODE_ID_DIGITS: Final = b"0123456789abcdef"  # lowercase hex only
_JOB_ID_LEN: Final = 40
_PORT_MAX: Final = 0xFFFF


class BusError(Exception):
    """A frame that cannot be encoded or decoded; the link should be closed."""


class MsgType(enum.IntEnum):
    """Type codes on the wire: the original's numbering, plus HANDSHAKE."""

    PING = 0
    PONG = 1  # reply to PING (and MEET), same shape
    MEET = 2  # a PING that makes the receiver add the sender to its nodes
    FAIL = 3  # the node is failing, by agreement
    REPLJOB = 4  # store a copy of this job
    GOTJOB = 5  # REPLJOB received
    ENQUEUE = 6  # queue the job you got by REPLJOB (ADDJOB ASYNC)
    QUEUED = 7  # I queued this job: push your re-queue time
    SETACK = 8  # the job was acknowledged
    WILLQUEUE = 9  # I will queue this job soon, object if you can
    GOTACK = 10  # SETACK received
    DELJOB = 11  # delete your copy, the ack is known everywhere
    NEEDJOBS = 12  # I have clients waiting on this queue
    YOURJOBS = 13  # NEEDJOBS answered: jobs moved to you
    WORKING = 14  # like QUEUED, and always dequeue
    PAUSE = 15  # set the paused state of a queue
    HANDSHAKE = 100  # ours: first frame on a link
    AUTH = 101  # ours: proof of the cluster secret, right after the handshakes
    BATCH = 102  # ours: several messages of one BATCHABLE type in one frame
    POSTPONE = 103  # ours: I queue this job after a delay (NACK/ENQUEUE DELAY)
    GETSTATS = 104  # ours: send me your figures (a dashboard shows the cluster)
    NODESTATS = 105  # ours: GETSTATS answered
    FINDJOB = 106  # ours: tell me about your copy of this job
    JOBCOPY = 107  # ours: FINDJOB answered
    REFUSED = 108  # ours: delete your copy, its ADDJOB was answered -NOREPL
    HAVEJOBS = 109  # ours: you asked for jobs of this queue; I have some now
    DELIVERED = 110  # ours: a consumer of mine has this job (no fail-over for it)
    PUBLISH = 111  # ours: a client's PUBLISH, for the subscribers here
    NODEFIGURES = 112  # ours: GETSTATS answered, with the job census (version 10)


# Field types with a wire rule beyond their Python type. Annotated keeps them
# plain ``str``/``int`` for mypy and the callers, while the converter sees
# the marker and picks a stricter hook.
class _Check(enum.Enum):
    NODE_ID = enum.auto()
    JOB_ID = enum.auto()
    PORT = enum.auto()
    SECONDS = enum.auto()


NodeId: TypeAlias = Annotated[str, _Check.NODE_ID]
JobId: TypeAlias = Annotated[str, _Check.JOB_ID]
Port: TypeAlias = Annotated[int, _Check.PORT]
Seconds: TypeAlias = Annotated[int, _Check.SECONDS]  # a job's TTL, DELAY or RETRY


# --------------------------------------------------------------------------
# Messages
# --------------------------------------------------------------------------


@attrs.frozen
class Handshake:
    """First frame on every link, in both directions."""

    TYPE: ClassVar[MsgType] = MsgType.HANDSHAKE

    node_id: NodeId
    ip: str
    port: Port  # client port
    cluster_port: Port
    nonce: bytes = b""  # NONCE_LEN random bytes, fresh for every link
    version: int = PROTOCOL_VERSION


@attrs.frozen
class Auth:
    """Right after the handshakes: ``handshake_proof`` for the sender's role
    (empty when the sender has no cluster secret)."""

    TYPE: ClassVar[MsgType] = MsgType.AUTH

    proof: bytes


@attrs.frozen
class GossipEntry:
    """What the sender knows about one other node (clusterMsgDataGossip)."""

    node_id: NodeId
    ip: str
    port: Port
    cluster_port: Port
    flags: int  # NODE_FLAG_* bits as the sender sees that node
    ping_sent_ms: int  # 0: no ping in flight
    pong_received_ms: int


@attrs.frozen
class Heartbeat:
    """The shape shared by PING, PONG and MEET (one packet kind in the original)."""

    sender: NodeId
    flags: int  # the sender's own NODE_FLAG_* bits, e.g. LEAVING
    gossip: tuple[GossipEntry, ...] = ()


@attrs.frozen
class Ping(Heartbeat):
    TYPE: ClassVar[MsgType] = MsgType.PING


@attrs.frozen
class Pong(Heartbeat):
    TYPE: ClassVar[MsgType] = MsgType.PONG


@attrs.frozen
class Meet(Heartbeat):
    TYPE: ClassVar[MsgType] = MsgType.MEET


@attrs.frozen
class Fail:
    TYPE: ClassVar[MsgType] = MsgType.FAIL

    node_id: NodeId


@attrs.frozen
class JobData:
    """A job as sent to another node: what the receiver needs to make its copy.

    The fields of the original's ``serializeJob(..., SER_MESSAGE)``. The
    expire time travels as ``ttl``, seconds left when sent, because node
    clocks are not synchronised: the receiver adds it to its own clock. Local
    state (job state, flags, qtime, confirmations) is not sent; a receiver
    derives it.
    """

    id: JobId
    queue: str
    body: bytes
    repl: int
    ctime: int  # ms * 1_000_000 + counter, at the creating node: orders queues
    ttl: Seconds  # seconds to live, at least 1
    delay: Seconds
    retry: Seconds  # 0 = at most once
    nacks: int
    deliveries: int
    nodes_delivered: tuple[NodeId, ...]  # the nodes that may have a copy


@attrs.frozen
class ReplJob:
    """Store a copy of this job; answer GOTJOB unless ``noreply``.

    ``job.nodes_delivered`` is the list of nodes that may have a copy: a
    receiver that already holds the job merges it into its own. ``noreply``
    is set when re-sending to a node that already confirmed, or for ADDJOB
    ASYNC (the original's CLUSTERMSG_FLAG0_NOREPLY).
    """

    TYPE: ClassVar[MsgType] = MsgType.REPLJOB

    job: JobData
    noreply: bool = False


@attrs.frozen
class GotJob:
    TYPE: ClassVar[MsgType] = MsgType.GOTJOB

    job_id: JobId


@attrs.frozen
class Enqueue:
    """Queue a job you already hold (sent after an ASYNC replication).

    Like the original, only the ID travels: the job itself went by REPLJOB.
    """

    TYPE: ClassVar[MsgType] = MsgType.ENQUEUE

    job_id: JobId
    delay: Seconds  # from reception before queueing; 0 = now


@attrs.frozen
class Queued:
    TYPE: ClassVar[MsgType] = MsgType.QUEUED

    job_id: JobId
    flags: int = 0  # FLAG_INCR_NACKS | FLAG_INCR_DELIV


@attrs.frozen
class SetAck:
    TYPE: ClassVar[MsgType] = MsgType.SETACK

    job_id: JobId
    may_have: int  # how many nodes the sender believes may have a copy


@attrs.frozen
class WillQueue:
    TYPE: ClassVar[MsgType] = MsgType.WILLQUEUE

    job_id: JobId


@attrs.frozen
class GotAck:
    TYPE: ClassVar[MsgType] = MsgType.GOTACK

    job_id: JobId
    known: bool  # the receiver of SETACK had the job


@attrs.frozen
class DelJob:
    TYPE: ClassVar[MsgType] = MsgType.DELJOB

    job_id: JobId


@attrs.frozen
class Refused:
    """Delete your copy: its ADDJOB was answered -NOREPL (the replication
    timed out), so no client acked it. A DELJOB says the job is done for
    good and its copies read as acked (WAITJOB); this one says the job was
    never added, and a copy that comes back (a holder's YOURJOBS, QUEUED or
    WILLQUEUE) is told REFUSED again rather than SETACK."""

    TYPE: ClassVar[MsgType] = MsgType.REFUSED

    job_id: JobId


@attrs.frozen
class NeedJobs:
    TYPE: ClassVar[MsgType] = MsgType.NEEDJOBS

    queue: str
    count: int


@attrs.frozen
class HaveJobs:
    """The sender has jobs of ``queue`` queued, and heard a NEEDJOBS for it
    from the receiver lately: if its consumers still wait, it asks the
    sender again now (version 8)."""

    TYPE: ClassVar[MsgType] = MsgType.HAVEJOBS

    queue: str


@attrs.frozen
class YourJobs:
    TYPE: ClassVar[MsgType] = MsgType.YOURJOBS

    jobs: tuple[JobData, ...]


@attrs.frozen
class Working:
    TYPE: ClassVar[MsgType] = MsgType.WORKING

    job_id: JobId


@attrs.frozen
class Delivered:
    """The sender handed this job to a consumer: hold your copy a RETRY
    from now, and do not take the job over if the sender is lost (version
    8). What WORKING says, for every delivery: its receiver does the least
    it can in the common case (a copy active here)."""

    TYPE: ClassVar[MsgType] = MsgType.DELIVERED

    job_id: JobId


@attrs.frozen
class Postpone:
    """The sender queues this job itself after ``delay_ms`` (a client's
    NACK or ENQUEUE with DELAY): hold your copy past that, as for WORKING.
    ``flags`` counts what the client's command counted (FLAG_INCR_NACKS
    for NACK, FLAG_INCR_DELIV for ENQUEUE of a delivered job); 0 when the
    sender repeats it (a WILLQUEUE answered, a holder learned), and
    FLAG_RELAYED alone when a holder passes it on."""

    TYPE: ClassVar[MsgType] = MsgType.POSTPONE

    job_id: JobId
    delay_ms: int  # from reception
    flags: int = 0


@attrs.frozen
class Pause:
    TYPE: ClassVar[MsgType] = MsgType.PAUSE

    queue: str
    flags: int  # the queue's new pause bits: 1 = in, 2 = out


@attrs.frozen
class GetStats:
    """Send me your figures (NODESTATS): a dashboard open on the sender
    shows the whole cluster (server/clusterview.py). ``request`` comes
    back in the answer."""

    TYPE: ClassVar[MsgType] = MsgType.GETSTATS

    request: int


@attrs.frozen
class QueueLength:
    """One queue of a NODESTATS: its name and the jobs waiting in it."""

    name: str
    length: int


@attrs.frozen
class NodeStats:
    """GETSTATS answered: what the sender's own dashboard shows of it.
    ``lengths`` lists its longest queues (a bounded number, see
    clusterview.py); ``omitted_jobs`` are the jobs waiting in the others,
    so that the lengths and it add up to every job queued there."""

    TYPE: ClassVar[MsgType] = MsgType.NODESTATS

    request: int
    uptime: int  # seconds
    used_memory: int  # bytes
    clients: int
    ops_per_sec: int
    queued: int  # jobs held, by state
    active: int
    acked: int
    wait_repl: int
    queues: int  # queues held, listed or not
    lengths: tuple[QueueLength, ...]
    omitted_jobs: int
    aof: str  # off, on, rewriting, failing (writes fail), wait-rewrite (turning on)
    aof_size: int  # bytes


@attrs.frozen
class QueueRequeue:
    """One queue of a NODEFIGURES: the jobs of it that the sender counts
    (see ``NodeFigures.jobs``) and that wait to be queued again, after
    their RETRY or a client's delay, and how long until the first is due."""

    name: str
    jobs: int
    next_ms: int  # from when the answer was made; 0: due now


@attrs.frozen
class NodeFigures:
    """GETSTATS answered on a link of protocol 10 or later (NODESTATS on
    one that speaks less): the sender's figures, plus its job census
    (server/jobcensus.py). ``jobs``: the jobs the sender counts for the
    cluster, each job being counted by one of its holders, so that the
    asker adds these up to jobs where the figures' own counts add up to
    copies. ``requeue`` lists the queues with jobs that wait to be queued
    again (a bounded number, the most such jobs first); ``omitted_requeue``
    are those of the others."""

    TYPE: ClassVar[MsgType] = MsgType.NODEFIGURES

    stats: NodeStats
    jobs: int
    requeue: tuple[QueueRequeue, ...]
    omitted_requeue: int


@attrs.frozen
class FindJob:
    """Tell me about your copy of this job (JOBCOPY)."""

    TYPE: ClassVar[MsgType] = MsgType.FINDJOB

    request: int
    job_id: JobId


@attrs.frozen
class JobCopy:
    """FINDJOB answered: the sender's copy of the job as SHOW sees it, or
    why it holds none. ``state`` is SHOW's (``queued``, ``active``,
    ``acked``, ``wait-repl``), empty without a copy; then ``gone`` says
    what the sender remembers of it lately (``acked``, ``expired``,
    ``moved``, ``deleted``), empty when nothing."""

    TYPE: ClassVar[MsgType] = MsgType.JOBCOPY

    request: int
    job_id: JobId
    state: str
    gone: str
    queue: str
    nacks: int
    deliveries: int  # additional deliveries
    requeue_ms: int  # until the copy is queued again (0: no requeue planned)
    ttl: int  # seconds left
    nodes_delivered: tuple[NodeId, ...]


@attrs.frozen
class Publish:
    """A client of the sender published ``message`` on ``channel``: deliver
    it to this node's subscribers (channels and patterns), and pass it on
    to nobody (the sender told every node it is linked to)."""

    TYPE: ClassVar[MsgType] = MsgType.PUBLISH

    channel: bytes
    message: bytes


Message: TypeAlias = (
    Handshake
    | Auth
    | Ping
    | Pong
    | Meet
    | Fail
    | ReplJob
    | GotJob
    | Enqueue
    | Queued
    | SetAck
    | WillQueue
    | GotAck
    | DelJob
    | Refused
    | NeedJobs
    | HaveJobs
    | YourJobs
    | Working
    | Delivered
    | Pause
    | Postpone
    | GetStats
    | NodeStats
    | NodeFigures
    | FindJob
    | JobCopy
    | Publish
)


# --------------------------------------------------------------------------
# The converter: strict hooks for leaf types, factories for containers
# --------------------------------------------------------------------------

_StructureHook: TypeAlias = Callable[[Any, Any], Any]
_UnstructureHook: TypeAlias = Callable[[Any], Any]


_MSGPACK_NAMES: Final[MappingProxyType[type, str]] = MappingProxyType({bytes: "bin", dict: "map"})


def _describe(value: object) -> str:
    """A short description of a bad value, in msgpack's terms, for error messages."""
    if type(value) is tuple:
        return f"an array of {len(value)}"  # msgpack arrays decode as tuples
    text = repr(value)
    if len(text) > 40:
        text = text[:37] + "..."
    kind = _MSGPACK_NAMES.get(type(value), type(value).__name__)
    return f"{kind} {text}"


def _structure_int(value: object, _: object) -> int:
    # `type() is` rejects bool, a subclass of int.
    if type(value) is not int or not 0 <= value <= MAX_INT64:
        raise BusError(f"expected an integer in 0..2**63-1, got {_describe(value)}")
    return value


def _structure_seconds(value: object, _: object) -> int:
    seconds = _structure_int(value, _)
    if seconds > MAX_JOB_SECONDS:
        raise BusError(f"expected seconds in 0..{MAX_JOB_SECONDS}, got {seconds}")
    return seconds


def _structure_port(value: object, _: object) -> int:
    port = _structure_int(value, _)
    if port > _PORT_MAX:
        raise BusError(f"expected a port number, got {port}")
    return port


def _structure_bool(value: object, _: object) -> bool:
    if type(value) is not bool:
        raise BusError(f"expected a boolean, got {_describe(value)}")
    return value


def _structure_bytes(value: object, _: object) -> bytes:
    if type(value) is not bytes:
        raise BusError(f"expected bin, got {_describe(value)}")
    return value


def _structure_str(value: object, _: object) -> str:
    if type(value) is not bytes:
        raise BusError(f"expected a string as bin, got {_describe(value)}")
    # surrogateescape cannot fail, and gives back exactly the str that was sent.
    return value.decode("utf-8", "surrogateescape")


def _structure_node_id(value: object, _: object) -> str:
    if (
        type(value) is not bytes
        or len(value) != _NODE_ID_LEN
        or value.translate(None, _NODE_ID_DIGITS)
    ):
        raise BusError(f"expected a node ID (40 lowercase hex digits), got {_describe(value)}")
    return value.decode("ascii")


def _structure_job_id(value: object, _: object) -> str:
    if type(value) is not bytes or len(value) != _JOB_ID_LEN or not value.isascii():
        raise BusError(f"expected a job ID (40 ASCII characters), got {_describe(value)}")
    return value.decode("ascii")


def _unstructure_str(value: str) -> bytes:
    return value.encode("utf-8", "surrogateescape")


def _as_is(value: Any) -> Any:
    return value


_CHECKED_STRUCTURE: Final[MappingProxyType[_Check, _StructureHook]] = MappingProxyType(
    {
        _Check.NODE_ID: _structure_node_id,
        _Check.JOB_ID: _structure_job_id,
        _Check.PORT: _structure_port,
        _Check.SECONDS: _structure_seconds,
    }
)


def _is_checked(cl: Any) -> bool:
    return get_origin(cl) is Annotated and any(isinstance(m, _Check) for m in cl.__metadata__)


def _checked_structure_factory(cl: Any) -> _StructureHook:
    (check,) = (m for m in cl.__metadata__ if isinstance(m, _Check))
    return _CHECKED_STRUCTURE[check]


def _checked_unstructure_factory(cl: Any) -> _UnstructureHook:
    # The rule only matters when reading; written, these are a str or an int.
    return _unstructure_str if get_args(cl)[0] is str else _as_is


def _is_homogeneous_tuple(cl: Any) -> bool:
    args = get_args(cl)
    return get_origin(cl) is tuple and len(args) == 2 and args[1] is Ellipsis


# Generated hooks. The checking hooks above and below (``_checked_*``) give
# the precise error for any bad value, field by field; most frames are good,
# so each class and array type also gets a function generated from its
# fields (as cattrs' own ``cattrs.gen`` does), which checks and converts
# every leaf inline and builds the object in one go. Its checks accept only
# what the checking hooks accept, and it converts the same way; on anything
# else (or a BusError from a nested hook) it calls the checking hook, which
# then raises the detailed error (figures in the module docstring).

# Leaf types checked inline: the condition on the msgpack value ``{v}`` and
# the expression of the converted value.
_INLINE: Final[MappingProxyType[Any, tuple[str, str]]] = MappingProxyType(
    {
        int: ("type({v}) is int and 0 <= {v} <= _MAX_INT64", "{v}"),
        Port: ("type({v}) is int and 0 <= {v} <= _PORT_MAX", "{v}"),
        Seconds: ("type({v}) is int and 0 <= {v} <= _MAX_JOB_SECONDS", "{v}"),
        bool: ("type({v}) is bool", "{v}"),
        bytes: ("type({v}) is bytes", "{v}"),
        str: ("type({v}) is bytes", "{v}.decode('utf-8', 'surrogateescape')"),
        NodeId: (
            "type({v}) is bytes and len({v}) == _NODE_ID_LEN"
            " and not {v}.translate(None, _NODE_ID_DIGITS)",
            "{v}.decode('ascii')",
        ),
        JobId: (
            "type({v}) is bytes and len({v}) == _JOB_ID_LEN and {v}.isascii()",
            "{v}.decode('ascii')",
        ),
    }
)
_INLINE_GLOBALS: Final[MappingProxyType[str, Any]] = MappingProxyType(
    {
        "_MAX_INT64": MAX_INT64,
        "_PORT_MAX": _PORT_MAX,
        "_MAX_JOB_SECONDS": MAX_JOB_SECONDS,
        "_JOB_ID_LEN": _JOB_ID_LEN,
        "_NODE_ID_LEN": _NODE_ID_LEN,
        "_NODE_ID_DIGITS": _NODE_ID_DIGITS,
        "BusError": BusError,
    }
)


# The checking hook of each generated one, by type (the tests compare them).
_CHECKING: Final[dict[Any, _StructureHook]] = {}


def _generate(name: str, source: str, namespace: dict[str, Any], cl: Any) -> Any:
    """Compile one generated hook for the type ``cl``; it shows as
    ``<bus-generated NAME of CL>`` in tracebacks, with its source (linecache)."""
    filename = f"<bus-generated {name} of {cl!r}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    scope = {**_INLINE_GLOBALS, **namespace}
    exec(compile(source, filename, "exec"), scope)
    return scope[name]


def _tuple_structure_factory(cl: Any, converter: cattrs.Converter) -> _StructureHook:
    item_type = get_args(cl)[0]
    item_hook = converter.get_structure_hook(item_type)

    def checked(value: object, _: object) -> tuple[Any, ...]:
        # msgpack arrays decode as tuples (use_list=False); cattrs' default
        # would build a tuple from any iterable, a str or a dict included.
        if type(value) is not tuple:
            raise BusError(f"expected an array, got {_describe(value)}")
        items = []
        for index, item in enumerate(value):
            try:
                items.append(item_hook(item, item_type))
            except BusError as exc:
                raise BusError(f"[{index}]: {exc}") from None
        return tuple(items)

    _CHECKING[cl] = checked
    inline = _INLINE.get(item_type)
    if inline is None:
        body = [
            "    if type(value) is tuple:",
            "        try:",
            "            return tuple([item_hook(x, item_type) for x in value])",
            "        except BusError:",
            "            pass",
        ]
    else:
        check, convert = (part.format(v="x") for part in inline)
        made = "value" if convert == "x" else f"tuple([{convert} for x in value])"
        body = [
            "    if type(value) is tuple:",
            "        for x in value:",
            f"            if not ({check}):",
            "                break",
            "        else:",
            f"            return {made}",
        ]
    source = "\n".join(["def structure(value, _):", *body, "    return checked(value, _)", ""])
    namespace = {"checked": checked, "item_hook": item_hook, "item_type": item_type}
    return _generate("structure", source, namespace, cl)  # type: ignore[no-any-return]


def _tuple_unstructure_factory(cl: Any, converter: cattrs.Converter) -> _UnstructureHook:
    item_hook = converter.get_unstructure_hook(get_args(cl)[0])
    if item_hook is _as_is:
        return _as_is  # msgpack packs a tuple of ints or bytes as it is

    def unstructure(value: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple([item_hook(item) for item in value])

    return unstructure


def _attrs_structure_factory(cl: type[Any], converter: cattrs.Converter) -> _StructureHook:
    attrs.resolve_types(cl)
    fields = [(f.name, converter.get_structure_hook(f.type), f.type) for f in attrs.fields(cl)]
    count = len(fields)

    def checked(value: object, _: object) -> Any:
        if type(value) is not tuple:
            raise BusError(f"expected an array of {count} fields, got {_describe(value)}")
        if len(value) != count:
            raise BusError(f"expected {count} fields, got {len(value)}")
        args = []
        for (name, hook, field_type), item in zip(fields, value, strict=True):
            try:
                args.append(hook(item, field_type))
            except BusError as exc:
                raise BusError(f"{name}: {exc}") from None
        return cl(*args)

    _CHECKING[cl] = checked
    namespace: dict[str, Any] = {"checked": checked, "cl": cl}
    conditions, made = [], []
    for index, (_name, hook, field_type) in enumerate(fields):
        var = f"f{index}"
        inline = _INLINE.get(field_type)
        if inline is None:
            namespace[f"h{index}"], namespace[f"t{index}"] = hook, field_type
            made.append(f"h{index}({var}, t{index})")
        else:
            conditions.append(inline[0].format(v=var))
            made.append(inline[1].format(v=var))
    unpack = ", ".join(f"f{index}" for index in range(count))
    test = " and ".join(f"({c})" for c in conditions) or "True"
    source = "\n".join(
        [
            "def structure(value, _):",
            f"    if type(value) is tuple and len(value) == {count}:",
            f"        {unpack}, = value",
            f"        if {test}:",
            "            try:",
            f"                return cl({', '.join(made)})",
            "            except BusError:",
            "                pass",
            "    return checked(value, _)",
            "",
        ]
    )
    return _generate("structure", source, namespace, cl)  # type: ignore[no-any-return]


def _attrs_unstructure_factory(cl: type[Any], converter: cattrs.Converter) -> _UnstructureHook:
    attrs.resolve_types(cl)
    namespace: dict[str, Any] = {}
    items = []
    for index, field in enumerate(attrs.fields(cl)):
        hook = converter.get_unstructure_hook(field.type)
        value = f"obj.{field.name}"
        if hook is _as_is:
            items.append(value)  # ints, bools and bytes go to msgpack untouched
        elif hook is _unstructure_str:
            items.append(f"{value}.encode('utf-8', 'surrogateescape')")
        else:
            namespace[f"h{index}"] = hook
            items.append(f"h{index}({value})")
    source = f"def unstructure(obj):\n    return ({', '.join(items)},)\n"
    return _generate("unstructure", source, namespace, cl)  # type: ignore[no-any-return]


def _make_converter() -> cattrs.Converter:
    """The one converter for the wire. Later registrations take precedence."""
    converter = cattrs.Converter()
    converter.register_structure_hook_factory(attrs.has, _attrs_structure_factory)
    converter.register_unstructure_hook_factory(attrs.has, _attrs_unstructure_factory)
    converter.register_structure_hook_factory(_is_homogeneous_tuple, _tuple_structure_factory)
    converter.register_unstructure_hook_factory(_is_homogeneous_tuple, _tuple_unstructure_factory)
    converter.register_structure_hook_factory(_is_checked, _checked_structure_factory)
    converter.register_unstructure_hook_factory(_is_checked, _checked_unstructure_factory)
    for cl, structure, unstructure in (
        (int, _structure_int, _as_is),
        (bool, _structure_bool, _as_is),
        (bytes, _structure_bytes, _as_is),
        (str, _structure_str, _unstructure_str),
    ):
        converter.register_structure_hook(cl, structure)
        converter.register_unstructure_hook(cl, unstructure)
    return converter


# Immutable after construction (cattrs only caches the hooks it builds), so
# nodes sharing a process in the simulator can share it.
_CONVERTER: Final = _make_converter()

_MESSAGE_CLASSES: Final[tuple[type[Message], ...]] = get_args(Message)
# Hooks looked up once, to skip cattrs' dispatch on every frame.
_DECODERS: Final[MappingProxyType[int, tuple[type[Message], _StructureHook]]] = MappingProxyType(
    {cl.TYPE: (cl, _CONVERTER.get_structure_hook(cl)) for cl in _MESSAGE_CLASSES}
)
_ENCODERS: Final[MappingProxyType[type[Message], _UnstructureHook]] = MappingProxyType(
    {cl: _CONVERTER.get_unstructure_hook(cl) for cl in _MESSAGE_CLASSES}
)

# The messages a BATCH frame may carry: a job ID and a number or flag at
# most, sent by the thousand when many jobs are held with a short RETRY
# (each holder's WILLQUEUE, the queued holder's QUEUED in answer). One frame
# for a run of them spares the per-frame work on both sides: encoding and
# decoding a QUEUED cost 0.7 and 1.7 us as a frame of its own, 0.14 and
# 0.44 us in a batch (CPython 3.11, timeit). The rest keep frames of their
# own: a REPLJOB or YOURJOBS may go stale in the outbox (peers.py), the
# failure detector's messages go ahead of the queued ones.
BATCHABLE: Final[frozenset[type[Message]]] = frozenset(
    {
        GotJob,
        Enqueue,
        Queued,
        SetAck,
        WillQueue,
        GotAck,
        DelJob,
        Working,
        Postpone,
        Refused,
        Delivered,
    }
)
# The first protocol version that has each message (the others are in
# every version this node speaks): never sent on a link that speaks less.
SINCE_VERSION: Final[MappingProxyType[type[Message], int]] = MappingProxyType(
    {
        Postpone: 4,
        GetStats: 5,
        NodeStats: 5,
        FindJob: 5,
        JobCopy: 5,
        Refused: 6,
        HaveJobs: HAVEJOBS_VERSION,
        Delivered: HAVEJOBS_VERSION,
        Publish: PUBLISH_VERSION,
        NodeFigures: FIGURES_VERSION,
    }
)

# At most this many messages in one BATCH: under 100 KB, far below any
# frame limit (PENDING_MAX_FRAME in peers.py is 256 KB).
BATCH_MAX: Final = 1024
_BATCH_DECODERS: Final = MappingProxyType(
    {code: entry for code, entry in _DECODERS.items() if entry[0] in BATCHABLE}
)


# --------------------------------------------------------------------------
# Authentication
# --------------------------------------------------------------------------

_PROOF_LABEL: Final = b"disque-trio bus v2 proof"


def handshake_proof(
    secret: bytes, role: bytes, connector: Handshake, acceptor: Handshake
) -> bytes:
    """What the side playing ``role`` (b"connector" or b"acceptor") sends in
    AUTH: an HMAC-SHA256, keyed by the cluster secret, of both handshakes'
    nonces and node IDs. The secret never travels. Both nonces make it fresh
    (a recorded proof is useless on another link), the role keeps a peer
    from reflecting our own proof back at us, and the IDs bind it to who
    claims to be talking. Empty when there is no secret."""
    if not secret:
        return b""
    message = b"|".join(
        (
            _PROOF_LABEL,
            role,
            connector.nonce,
            acceptor.nonce,
            connector.node_id.encode(),
            acceptor.node_id.encode(),
        )
    )
    return hmac.new(secret, message, hashlib.sha256).digest()


# --------------------------------------------------------------------------
# Frames
# --------------------------------------------------------------------------


def encode_frame(msg: Message, max_frame: int = MAX_FRAME) -> bytes:
    """The frame carrying ``msg``: length prefix and msgpack payload.

    Raises ``BusError`` if the message cannot be encoded (a str with a lone
    surrogate that surrogateescape did not produce, an int beyond 64 bits)
    or would be larger than ``max_frame``, which the peer would refuse.
    """
    encoder = _ENCODERS.get(type(msg))
    if encoder is None:
        raise BusError(f"not a bus message: {_describe(msg)}")
    try:
        payload: bytes = msgpack.packb((msg.TYPE, encoder(msg)), use_bin_type=True)
    except Exception as exc:  # msgpack and str.encode raise several kinds
        raise BusError(f"cannot encode {msg.TYPE.name}: {exc}") from exc
    if len(payload) > max_frame:
        raise BusError(f"{msg.TYPE.name} frame of {len(payload)} bytes exceeds {max_frame}")
    return len(payload).to_bytes(_HEADER_LEN, "big") + payload


def encode_batch(msgs: list[Message], max_frame: int = MAX_FRAME) -> bytes:
    """One BATCH frame carrying ``msgs``: 1 to ``BATCH_MAX`` messages of
    one ``BATCHABLE`` class, handled by the receiver in this order. Raises
    ``BusError`` like ``encode_frame``."""
    cl = type(msgs[0])
    if cl not in BATCHABLE or not 0 < len(msgs) <= BATCH_MAX:
        raise BusError(f"cannot batch {len(msgs)} of {_describe(msgs[0])}")
    for msg in msgs:
        if type(msg) is not cl:
            raise BusError(f"a {cl.TYPE.name} batch holds {_describe(msg)}")
    encoder = _ENCODERS[cl]
    try:
        bodies = [encoder(msg) for msg in msgs]
        payload: bytes = msgpack.packb((MsgType.BATCH, (cl.TYPE, bodies)), use_bin_type=True)
    except Exception as exc:  # msgpack and str.encode raise several kinds
        raise BusError(f"cannot encode a {cl.TYPE.name} batch: {exc}") from exc
    if len(payload) > max_frame:
        raise BusError(f"BATCH frame of {len(payload)} bytes exceeds {max_frame}")
    return len(payload).to_bytes(_HEADER_LEN, "big") + payload


def _decode_batch(body: object) -> list[Message]:
    """A BATCH's body to its messages, in reverse order (popped from the
    end by FrameDecoder)."""
    if type(body) is not tuple or len(body) != 2:
        raise BusError(f"bad BATCH: expected [type, [body, ...]], got {_describe(body)}")
    code, bodies = body
    entry = _BATCH_DECODERS.get(code) if type(code) is int else None
    if entry is None:
        raise BusError(f"bad BATCH: type {_describe(code)} cannot be batched")
    cl, decoder = entry
    if type(bodies) is not tuple or not 0 < len(bodies) <= BATCH_MAX:
        raise BusError(f"bad BATCH of {cl.TYPE.name}: expected 1 to {BATCH_MAX} bodies")
    try:
        msgs: list[Message] = [decoder(item, cl) for item in reversed(bodies)]
    except BusError as exc:
        raise BusError(f"bad {cl.TYPE.name} in a BATCH: {exc}") from None
    except Exception as exc:  # a bug of ours: still only this link's end
        raise BusError(f"bad {cl.TYPE.name} in a BATCH: {type(exc).__name__} {exc}") from exc
    return msgs


def _decode_payload(payload: bytearray) -> Message | list[Message]:
    """One frame's payload to its message (a BATCH's: to its messages,
    last first)."""
    try:
        envelope = msgpack.unpackb(payload, use_list=False, raw=False)
    except Exception as exc:  # msgpack raises ValueError, TypeError, StackError...
        raise BusError(f"bad msgpack payload: {type(exc).__name__} {exc}") from exc
    if type(envelope) is not tuple or len(envelope) != 2:
        raise BusError(f"expected a [type, body] array, got {_describe(envelope)}")
    code, body = envelope
    entry = _DECODERS.get(code) if type(code) is int else None
    if entry is None:
        if type(code) is int and code == MsgType.BATCH:
            return _decode_batch(body)
        raise BusError(f"unknown message type {_describe(code)}")
    cl, decoder = entry
    try:
        msg: Message = decoder(body, cl)
    except BusError as exc:
        raise BusError(f"bad {cl.TYPE.name}: {exc}") from None
    except Exception as exc:
        # Only a bug of ours gets here: the hooks raise BusError alone. Still,
        # the link task relies on this: a peer can get its link closed, but
        # cannot make the node crash.
        raise BusError(f"bad {cl.TYPE.name}: {type(exc).__name__} {exc}") from exc
    return msg


def _text_hint(buf: bytearray) -> str:
    """What to say of a length header that reads as text: a client (RESP:
    "PING", "*1\r\n"; HTTP: "GET ") talking to the bus port."""
    head = bytes(buf[:_HEADER_LEN])
    if all(32 <= b < 127 or b in (9, 10, 13) for b in head):
        return f"; it reads as text ({head!r}): not cluster bus traffic, a client on the bus port?"
    return ""


class FrameDecoder:
    """Turns a byte stream into messages, sans I/O (like h11's receive_data).

    ``feed()`` whatever the socket gave, then call ``next_message()`` until
    it returns ``None``. Bytes may arrive split anywhere.
    """

    __slots__ = ("_buf", "_error", "_max_frame", "_ready", "frames")

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        if not 0 < max_frame <= MAX_FRAME_LIMIT:
            raise ValueError(f"max_frame must be in 1..{MAX_FRAME_LIMIT}, got {max_frame}")
        self._max_frame = max_frame
        # Unconsumed bytes. A complete frame is cut from the front with
        # `del`, which CPython does by moving the array's start (no copy), so
        # input in any split is handled in linear time.
        self._buf = bytearray()
        # The first error, raised again on every later call: once a frame was
        # refused the stream cannot be trusted, the link must be closed.
        self._error: BusError | None = None
        # The messages of a BATCH not returned yet, the next one last.
        self._ready: list[Message] = []
        self.frames = 0  # frames decoded (a BATCH is one)

    def feed(self, data: bytes) -> None:
        self._buf += data

    def set_max_frame(self, max_frame: int) -> None:
        """Change the limit for the frames still to come (a link allows big
        frames once it is authenticated)."""
        if not 0 < max_frame <= MAX_FRAME_LIMIT:
            raise ValueError(f"max_frame must be in 1..{MAX_FRAME_LIMIT}, got {max_frame}")
        self._max_frame = max_frame

    def next_message(self) -> Message | None:
        """The next complete message, or ``None`` if more bytes are needed."""
        if self._ready:
            return self._ready.pop()
        if self._error is not None:
            raise self._error
        try:
            return self._next_message()
        except BusError as exc:
            self._error = exc
            raise

    def _next_message(self) -> Message | None:
        buf = self._buf
        if len(buf) < _HEADER_LEN:
            return None
        length = int.from_bytes(buf[:_HEADER_LEN], "big")
        if length > self._max_frame:
            raise BusError(f"frame of {length} bytes exceeds {self._max_frame}{_text_hint(buf)}")
        end = _HEADER_LEN + length
        if len(buf) < end:
            return None
        payload = buf[_HEADER_LEN:end]
        del buf[:end]
        msg = _decode_payload(payload)
        self.frames += 1
        if isinstance(msg, list):
            self._ready = msg
            return msg.pop()
        return msg
