"""The node-to-node job protocol (docs/design.md): functions of a node
(any :class:`~disque_trio.core.host.JobHost`; ``Node`` is one).

Rules, one per message:

* REPLJOB: store the job as ``active`` (or merge the node list if known),
  answer GOTJOB unless told not to. Refused for queues paused in input,
  while leaving, and for jobs deleted here lately (a late copy, sent before
  the job was collected, would resurrect it); for one acked here, SETACK 0
  is the answer (the sender missed the ack). Receivers never queue it: they
  re-queue after RETRY unless told (QUEUED) that someone else did. None is
  sent for a job whose TTL ran out (in the second before its timer expires
  it), nor is one moved by NEEDJOBS.
* GOTJOB: the sender holds a copy. When REPLICATE nodes confirmed, the job
  is replicated: queue it here and answer the waiting ADDJOB client.
* WILLQUEUE: a holder will re-queue soon. If queued here, send QUEUED to
  every holder (it will not queue; another queued copy resolves by the
  QUEUED rule); if acked here, answer SETACK.
* A queued copy whose retry point passes without QUEUED having gone to
  every holder since the last one re-announces it (QUEUED, counting
  nothing): messages are lost on a dropped link, and two queued copies
  otherwise stay silent for ever.
* WILLQUEUE / QUEUED / WORKING for a job acked and deleted here lately: the
  sender missed the ack (lost DELJOB): SETACK 0, it collects it itself.
* QUEUED / WORKING: someone queued it (or a client works on it): push our
  re-queue timer by RETRY; if also queued here, dequeue when the sender wins
  the per-job comparison of node IDs (always for WORKING). A QUEUED counting
  nothing (a copy moved or announced, not a client's NACK or ENQUEUE) for a
  job a consumer of ours has, within its RETRY here, is answered DELIVERED:
  the sender dequeues its copy.
* SETACK(may-have): acknowledge; GOTACK back when we know no more holders
  than the sender, else collect the job ourselves. For our own ADDJOB still
  waiting for its copies, the client gets its ID, and the job is never
  queued here (a blocked GETJOB would get it before the acknowledgement).
* GOTACK(known): the sender confirmed the ack; when every holder did, send
  DELJOB to them all and delete. Dummy acks go once a holder answers, or once
  every node said it does not know the job.
* DELJOB: forget the job and remember its ID for a while, held or not, as
  acked: the job is done for good, and a holder the DELJOB missed is told
  SETACK when it announces its copy.
* ENQUEUE: queue it now (or after the delay): the sender chose us.
* POSTPONE(delay): a client asked the sender to queue the job after a
  delay (NACK or ENQUEUE with DELAY): dequeue ours if queued, and re-queue
  no sooner than the delay plus RETRY (the sender queues it; we stand by
  in case it cannot), and pass it on, counting nothing, to the holders we
  list but the sender (whose list may lack some); a relayed POSTPONE goes
  no further, and leaves a delay of our own client's in place, to the
  later end. A holder that missed it announces WILLQUEUE at its
  own RETRY: the sender, still waiting, answers POSTPONE again, as it
  does to holders it learns of, and to a holder's QUEUED or WORKING (which
  may have crossed the POSTPONE) instead of ending its delay. A holder
  waiting for a delay of its own client's too queues the job at the later
  end if it wins the per-job comparison of node IDs, else stands by. Each
  is remembered until its delay ends: a YOURJOBS written before its sender
  heard of the delay leaves the job standing by (or brings it so, when it
  overtook the POSTPONE), not queued.
* NEEDJOBS(queue, n): give up to n jobs of a non-empty queue (half of them
  when short) in YOURJOBS, none whose TTL ran out (those expire); YOURJOBS:
  queue what arrived, remember the source. A NEEDJOBS also makes its
  sender interested in the queue for INTEREST_MS: a job of it queued here
  with no consumer of ours waiting sends it HAVEJOBS (at most every
  HAVEJOBS_MIN_INTERVAL_MS); HAVEJOBS: the sender is a source, asked at
  once (NEEDJOBS) if our consumers wait with nothing queued.
* Where a job is queued: a copy remembers the holder whose REPLJOB (the
  node that added it, keeping a copy), QUEUED or POSTPONE it heard last
  (``queued_on``); WORKING (and our own queueing) clears it. A node hands
  a job to a client and, at its next cron, tells the other holders
  WORKING if a consumer still holds it. When that holder is lost (FAIL, a
  new incarnation), one surviving holder queues the job at once, the
  others stand by (take_over).
* PAUSE: set the queue's pause flags.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..protocol import bus
from ..protocol.replies import ReplyError, Status
from .cluster import NOT_REACHABLE
from .host import JobHost
from .job import (
    FLAG_ANNOUNCE,
    FLAG_BCAST_QUEUED,
    FLAG_BCAST_WILLQUEUE,
    FLAG_DELAYED,
    FLAG_DELIVERED,
    FLAG_HANDED,
    FLAG_HOLDERS_GREW,
    FLAG_TOLD_QUEUED,
    STATE_ACKED,
    STATE_ACTIVE,
    STATE_QUEUED,
    STATE_WAIT_REPL,
    TIME_ERROR_MS,
    Job,
)
from .queue import PAUSED_IN, PAUSED_OUT, Pause, Queue
from .records import job_data, job_from_data, merge_holders, pending_of
from .waiters import Waiter

REPL_ADD_NODE_MS = 50  # while short of replicas, one more node this often
# With no node left to add, the REPLJOB goes again to the holders that did
# not answer: first after REPL_RESEND_MIN_MS of wait, then after as long as
# the wait has lasted, up to REPL_RESEND_MAX_MS.
REPL_RESEND_MIN_MS = 500
REPL_RESEND_MAX_MS = 1000
NEEDJOBS_MIN_REQUEST = 5
NEEDJOBS_MAX_REQUEST = 100
NEEDJOBS_BCAST_MIN_MS = 2000
NEEDJOBS_BCAST_MAX_MS = 30_000
NEEDJOBS_ADHOC_MIN_MS = 25
NEEDJOBS_ADHOC_MAX_MS = 2000
RESPONDER_VALIDITY_S = 5
# A NEEDJOBS makes its sender an interested node for this long: a job
# queued here meanwhile, with no consumer of ours waiting, is announced to
# it at once (HAVEJOBS). Longer than the longest gap between two NEEDJOBS
# broadcasts of a node whose consumers keep waiting (NEEDJOBS_BCAST_MAX_MS).
INTEREST_MS = NEEDJOBS_BCAST_MAX_MS + 10_000
# At most one HAVEJOBS per queue and interested node this often: a node
# whose consumers left keeps its interest a while, and a busy queue here
# must not send it a message per job.
HAVEJOBS_MIN_INTERVAL_MS = 250
# A holder that does not take over a lost node's job itself (another one is
# chosen) queues it this long after the loss unless a QUEUED came meanwhile
# (the one chosen may be lost too, or not know of the loss yet), and
# FAILOVER_STAGGER_MS more per rank after the first among the holders left
# (time for the QUEUED of the one before to arrive; at most 5 ranks: 1.8 s).
FAILOVER_STANDBY_MS = 1000
FAILOVER_STAGGER_MS = 200
POSTPONES_HEARD_MAX = 10_000  # POSTPONEs remembered until their delay ends
# The epoch of an acked tombstone that a later ACKJOB must not trust
# (Node.acked_epoch never gives it): a dummy ack every node answered.
NO_EPOCH = (-1, -1)
REFUSED_BUS_VERSION = bus.SINCE_VERSION[bus.Refused]

NOREPL_TIMEOUT = ReplyError(
    "NOREPL", "Timeout reached before replicating to the requested number of nodes"
)
NOREPL_EXPIRED = ReplyError(
    "NOREPL",
    "job removed (expired?) before the requested replication level was achieved",
)


def compare_ids_by_job(a: str, b: str, job_id: str) -> int:
    """Which of two nodes wins for this job: the IDs mixed with the job's
    random part, so that no node always wins (like the original)."""
    mix_a = _id_mix(a, job_id)
    mix_b = _id_mix(b, job_id)
    return (mix_a > mix_b) - (mix_a < mix_b)


def _id_mix(node_id: str, job_id: str) -> bytes:
    """A node ID mixed with the job's random part (compare_ids_by_job)."""
    salt = job_id[11:35]
    return bytes(ord(x) ^ ord(salt[i % 24]) for i, x in enumerate(node_id))


# ----------------------------------------------------------- replication


def ttl_ran_out(job: Job, now: int) -> bool:
    """The job's TTL is over; its timer expires it within a second (the
    original's granularity). No copy of it may leave in that second: it
    would travel with the one second of TTL ``job_data`` sends at least,
    and live that much longer there (simulator seed 107705)."""
    return job.etime * 1000 <= now


def rest_of_second(now: int) -> int:
    """How long (ms) the TTLs read at ``now`` hold: they travel in whole
    seconds left, so a message carrying them, written in a later second of
    the wall clock, would give its jobs more (``Send.valid_ms``)."""
    return 1000 - now % 1000


def replicate(node: JobHost, job: Job, count: int, noreply: bool, forgotten: bool = False) -> int:
    """Add up to ``count`` random reachable nodes to the job's holders
    and (re)send REPLJOB to every holder. Returns how many were added
    (none, and nothing sent, once the job's TTL ran out). ``forgotten``:
    this node forgets the job in this commit (an external replication that
    ended), so the shell cannot bring the copies' TTL up to date when it
    writes them."""
    now = node.now_ms()
    if ttl_ran_out(job, now):
        return 0
    added = 0
    if count > 0:
        candidates = [n.node_id for n in node.cluster.reachable() if n.link_up]
        node.rng.shuffle(candidates)
        for node_id in candidates:
            if added == count:
                break
            if node_id not in job.nodes_delivered:
                job.nodes_delivered = (*job.nodes_delivered, node_id)
                added += 1
    data = job_data(job, now)
    confirmed = job.nodes_confirmed or ()
    # One message object per kind, sent to each (the shell encodes it once).
    answer = bus.ReplJob(data, noreply)
    quiet = answer if noreply or not confirmed else bus.ReplJob(data, True)
    # A copy of a job held here when it is written carries the TTL its job
    # has left then (Bus._outgoing). One of a job forgotten by then carries
    # the TTL read now, whole seconds left in this second of the wall
    # clock: it holds until the end of that second only, as a YOURJOBS's
    # does. Written later, the receiver would keep the job past its TTL
    # (simulator seed 166117: a REPLJOB waited 7.7 s for a link, and a TTL
    # 4 job was delivered 8.73 s after its ADDJOB).
    valid_ms = rest_of_second(now) if forgotten else 0
    for node_id in job.nodes_delivered:
        if node_id != node.node_id:
            node.effects.send(node_id, quiet if node_id in confirmed else answer, valid_ms)
    return added


def start_sync_replication(node: JobHost, job: Job, timeout_ms: int) -> Waiter:
    """ADDJOB without ASYNC and REPLICATE > 1: wait for GOTJOBs."""
    job.state = STATE_WAIT_REPL
    local = node.node_id in job.nodes_delivered
    job.nodes_confirmed = node.myself_only if local else ()
    job.qtime = node.now_ms() + REPL_ADD_NODE_MS  # next "add a node" time
    node.register(job)
    waiter = Waiter(job_id=job.id, timeout_ms=timeout_ms)
    node.repl_waiters[job.id] = waiter
    replicate(node, job, job.repl - (1 if local else 0), noreply=False)
    return waiter


def send_enqueue(node: JobHost, job: Job, confirmed: tuple[str, ...]) -> None:
    """Ask one random holder that confirmed its copy (GOTJOB) to queue the
    job (we keep no copy of it). Not one that was only sent a copy: it may
    never have had it, or get it only when its TTL is nearly over
    (simulator seed 166117: the ENQUEUE went to a node frozen and cut off,
    and waited 7.7 s for its link with a REPLJOB)."""
    holders = [n for n in confirmed if n != node.node_id]
    if holders:
        target = holders[int(node.rng.random() * len(holders))]
        node.effects.send(target, bus.Enqueue(job.id, job.delay))


def replication_achieved(node: JobHost, job: Job, acked: bool = False) -> None:
    """The job has its copies: answer the ADDJOB client and queue it.
    ``acked``: a SETACK ended the wait (a holder queued and delivered its
    copy, and it was acked there): the caller acknowledges it, so it is
    neither queued here nor sent to a holder to queue; a job replicated
    externally (no copy here) is forgotten instead, as acked."""
    job.state = STATE_ACTIVE
    confirmed = job.nodes_confirmed or ()
    job.nodes_confirmed = None
    waiter = node.repl_waiters.pop(job.id, None)
    if waiter is not None and not waiter.done:
        node.finish_wait(waiter, Status(job.id))
    external = node.node_id not in job.nodes_delivered
    if job.flags & FLAG_HOLDERS_GREW:
        # Holders that took the first REPLJOB learn the nodes added since
        # (the REPLJOB of each addition went to them too, but may be lost).
        # Otherwise the first REPLJOB had the whole list: nothing to send,
        # as in the original (two frames fewer per job).
        job.flags &= ~FLAG_HOLDERS_GREW
        replicate(node, job, 0, noreply=True, forgotten=external)
    if external:
        # Externally replicated: one holder queues it, we forget it (as
        # acked when a SETACK ended the wait: the holders collect it).
        if acked:
            node.unregister(job, acked=True)
        else:
            send_enqueue(node, job, confirmed)
            node.hand_over(job, follow=False)
        return
    now = node.now_ms()
    if not acked:
        # Its first queue time before its record: while it waited, qtime
        # was the next replication try, and a node restarted before the
        # DELAY ran out queued the job at the RETRY after its restart
        # instead (simulator seed 154395: DELAY 3, delivered after 2.2 s).
        job.qtime = now + (job.delay or job.retry) * 1000
    node.persist(job)
    if acked:
        return
    if job.delay == 0:
        node.enqueue(job, now=now)
    else:
        node.update_awake(job)


def repl_tick(node: JobHost, job: Job, now: int) -> None:
    """A job still waiting for replication: try one more node, or send the
    REPLJOB again to the holders that did not answer yet.

    While a node can be added, one every REPL_ADD_NODE_MS (the REPLJOB goes
    to every holder again with it). Once every reachable node holds the
    job, the silent ones are slow or lost the message: they get it again
    after REPL_RESEND_MIN_MS of wait, then at intervals as long as the wait
    so far (up to REPL_RESEND_MAX_MS). Re-sent every 50 ms, a loaded
    cluster flooded itself: with REPLICATE 3 on three nodes at -P 16 the
    copies take 200 ms, each queued behind the re-sends of the others
    (4.6 REPLJOBs per job instead of 2), and some waits passed a 5 s
    timeout. The original re-sends from its client cron, which visits
    each client about once a second under load."""
    if any(n.link_up and n.node_id not in job.nodes_delivered for n in node.cluster.reachable()):
        if replicate(node, job, 1, noreply=False):
            job.flags |= FLAG_HOLDERS_GREW
        job.qtime = now + REPL_ADD_NODE_MS
        return
    waited = now - job.ctime // 1_000_000
    if waited < REPL_RESEND_MIN_MS:
        job.qtime = now + REPL_RESEND_MIN_MS - waited
        return
    replicate(node, job, 0, noreply=False)
    job.qtime = now + min(REPL_RESEND_MAX_MS, waited)


def replication_aborted(node: JobHost, job: Job) -> None:
    """The job expired (or was deleted) while the client waited."""
    waiter = node.repl_waiters.pop(job.id, None)
    if waiter is not None and not waiter.done:
        node.stats.replication_failures += 1
        node.finish_wait(waiter, NOREPL_EXPIRED)
    job.state = STATE_ACTIVE
    _refuse(node, job)  # remembered as deleted by unregister, our caller


def replication_timed_out(node: JobHost, waiter: Waiter) -> ReplyError:
    """ADDJOB's timeout passed: delete the copies (best effort)."""
    assert waiter.job_id is not None
    node.stats.replication_failures += 1
    node.repl_waiters.pop(waiter.job_id, None)
    job = node.jobs.get(waiter.job_id)
    if job is not None and job.state == STATE_WAIT_REPL:
        job.state = STATE_ACTIVE
        _refuse(node, job)
        node.unregister(job)
    return NOREPL_TIMEOUT


def _refuse(node: JobHost, job: Job) -> None:
    """The job's ADDJOB is answered -NOREPL: its copies are told DELJOB,
    and its ID is refused here while remembered as deleted. Its client was
    told the job was not added: a copy a holder queued at its RETRY and
    gave away by YOURJOBS before our DELJOB reached it must not bring it
    back here (simulator seed 482158: delivered 0.3 s after the -NOREPL,
    then acked by the holders' DELJOB tombstones, and WAITJOB answered
    "acked" for a job nobody acked). The copies are told REFUSED, not
    DELJOB, where the link speaks it: a holder that read DELJOB remembered
    the job as acked, answered another holder that missed the message with
    SETACK, and WAITJOB there answered "acked" (seed 490768)."""
    for node_id in job.nodes_delivered:
        if node_id != node.node_id:
            node.effects.send(node_id, refused(node, node_id, job.id))
    node.deleted_refused.add(job.id)


def refused(node: JobHost, peer: str, job_id: str) -> bus.Refused | bus.DelJob:
    """What tells ``peer`` that the job's ADDJOB was answered -NOREPL:
    REFUSED, or DELJOB for a node of a release before it (bus protocol 5
    and older: its copy reads as acked there, as before)."""
    other = node.cluster.nodes.get(peer)
    if other is not None and other.bus_version >= REFUSED_BUS_VERSION:
        return bus.Refused(job_id)
    return bus.DelJob(job_id)


def _deljob_to_holders(node: JobHost, job: Job) -> None:
    msg = bus.DelJob(job.id)
    for node_id in job.nodes_delivered:
        if node_id != node.node_id:
            node.effects.send(node_id, msg)


# ------------------------------------------------------------- fail-over


def take_over(node: JobHost, job: Job, lost: str, now: int) -> None:
    """The holder that had this job queued (``lost``) is gone (FAIL, or
    restarted and so lost its queues) without handing it to a consumer: the
    job owes nobody its RETRY. One surviving holder queues it now (at the
    end of a DELAY or a client's delay still running there), announcing it
    to the others (QUEUED, counting nothing); the others stand by for
    FAILOVER_STANDBY_MS more (and FAILOVER_STAGGER_MS per rank after the
    first), in case the one chosen cannot (it is lost too, or has not seen
    the loss yet). The one chosen wins the per-job
    comparison of node IDs among the holders this node sees reachable (and
    itself, unless leaving), so that the holders of the cluster's jobs
    share the work; the others rank by the same comparison, so that when
    the one chosen cannot, one of them queues it a second later and the
    next ones hear its QUEUED before their turn, not all at once (simulator
    seed 232603168: two stood by for a holder that had not flagged the
    loss, and both queued the job when their stand-by ended). A leaving
    holder queues it last, after every other one's stand-by. Each holder
    decides alone, and two that see the cluster differently both queue it:
    the QUEUED rule then keeps one."""
    at = now
    delay_end = job.ctime // 1_000_000 + job.delay * 1000
    if job.delay and delay_end > now:
        at = delay_end  # added there with a DELAY not over yet
    heard = node.postpones_heard.get(job.id)
    if heard is not None and heard[2] == lost and heard[0] > at:
        at = heard[0]  # a client's NACK or ENQUEUE DELAY there
    me = node.node_id
    nodes = node.cluster.nodes
    candidates = [
        holder
        for holder in job.nodes_delivered
        if holder != lost
        and (
            (holder == me and not node.leaving)
            or (holder in nodes and holder != me and not nodes[holder].flags & NOT_REACHABLE)
        )
    ]
    ranked = sorted(candidates, key=lambda h: _id_mix(h, job.id), reverse=True)
    chosen = ranked[0] if ranked else me
    # A leaving node comes after every holder it sees, by one stagger more
    # than a holder not yet told it leaves can rank itself (that one counts
    # it among the candidates: simulator seed 753342, both ranked second,
    # stood by a second, and queued the job together).
    rank = ranked.index(me) if me in ranked else len(ranked) + 1
    job.flags |= FLAG_ANNOUNCE
    if chosen == me:
        node.probe("failover-taken", job)
        job.flags &= ~FLAG_BCAST_WILLQUEUE
        if at <= now:
            node.enqueue(job, now=now)
            return
        job.qtime = at
    else:
        node.probe("failover-standby", job)
        job.flags |= FLAG_BCAST_WILLQUEUE
        job.qtime = at + FAILOVER_STANDBY_MS + FAILOVER_STAGGER_MS * min(rank - 1, 4)
    node.update_awake(job, now=now)


# ------------------------------------------------------ hooks from node


def broadcast_queued(node: JobHost, job: Job, nack: bool) -> None:
    msg = bus.Queued(job.id, bus.FLAG_INCR_NACKS if nack else bus.FLAG_INCR_DELIV)
    for node_id in job.nodes_delivered:
        if node_id != node.node_id:
            node.effects.send(node_id, msg)


def announce_queued(node: JobHost, job: Job) -> None:
    """Tell every other holder that the job is queued here (counting
    nothing): they push their timers; a queued one keeps a single copy."""
    msg = bus.Queued(job.id, 0)
    for node_id in job.nodes_delivered:
        if node_id != node.node_id:
            node.effects.send(node_id, msg)


def tell_new_holders(node: JobHost, job: Job, node_ids: Iterable[str]) -> None:
    """Holders just added to the list of a job queued here hear QUEUED: if
    one queued its own copy without knowing ours, the QUEUED rule leaves one
    (pending holders adopted, seeds 20000327 and others; a merged list,
    seed 20005489). Of a job acked here they hear SETACK: the collection
    waits for their GOTACK (seed 492135135). Of one waiting here for a
    client's delay, POSTPONE."""
    if job.state == STATE_ACKED:
        msg: bus.Message | None = bus.SetAck(job.id, len(job.nodes_delivered))
    elif job.state == STATE_QUEUED and job.retry:
        msg = bus.Queued(job.id, 0)
    else:
        msg = postpone_left(job, node.now_ms())
    if msg is None:
        return
    for node_id in node_ids:
        node.effects.send(node_id, msg)


def send_willqueue(node: JobHost, job: Job) -> None:
    msg = bus.WillQueue(job.id)
    for node_id in job.nodes_delivered:
        if node_id != node.node_id:
            node.effects.send(node_id, msg)


def send_setack(node: JobHost, job: Job) -> None:
    """Ask the holders that have not confirmed the ack (everyone, for a
    dummy ack: we do not know who holds it)."""
    confirmed = job.nodes_confirmed or ()
    if job.is_dummy_ack:
        targets = [n.node_id for n in node.cluster.others()]
    else:
        targets = [n for n in job.nodes_delivered if n != node.node_id]
    msg = bus.SetAck(job.id, len(job.nodes_delivered))
    for node_id in targets:
        if node_id not in confirmed:
            node.effects.send(node_id, msg)


def broadcast_deljob(node: JobHost, job_id: str, job: Job | None) -> None:
    if job is not None:
        targets = [n for n in job.nodes_delivered if n != node.node_id]
    else:
        targets = [n.node_id for n in node.cluster.others()]
    msg = bus.DelJob(job_id)
    for node_id in targets:
        node.effects.send(node_id, msg)


def broadcast_working(node: JobHost, job: Job) -> None:
    msg = bus.Working(job.id)
    for node_id in job.nodes_delivered:
        if node_id != node.node_id:
            node.effects.send(node_id, msg)


def tell_delivered(node: JobHost, job: Job) -> None:
    """The job, handed to a client here, is still in a consumer's hands:
    its other holders hear DELIVERED (WORKING, a node of a release before
    bus protocol 8). DELIVERED rather than WORKING: it spares the holder
    a timer filed again per job (_on_delivered)."""
    delivered = working = None
    nodes = node.cluster.nodes
    for node_id in job.nodes_delivered:
        if node_id == node.node_id:
            continue
        peer = nodes.get(node_id)
        if peer is None or peer.bus_version >= bus.HAVEJOBS_VERSION:
            delivered = delivered or bus.Delivered(job.id)
            node.effects.send(node_id, delivered)
        else:
            working = working or bus.Working(job.id)
            node.effects.send(node_id, working)


def _tell_one_delivered(node: JobHost, job: Job, node_id: str) -> None:
    peer = node.cluster.nodes.get(node_id)
    if peer is None or peer.bus_version >= bus.HAVEJOBS_VERSION:
        node.effects.send(node_id, bus.Delivered(job.id))
    else:
        node.effects.send(node_id, bus.Working(job.id))


def broadcast_postpone(node: JobHost, job: Job, delay_ms: int, flags: int) -> None:
    """NACK or ENQUEUE with DELAY: the other holders hold their copies
    past the delay (and count what the command counted)."""
    msg = bus.Postpone(job.id, delay_ms, flags)
    for node_id in job.nodes_delivered:
        if node_id != node.node_id:
            node.effects.send(node_id, msg)


def postpone_left(job: Job, now: int) -> bus.Postpone | None:
    """POSTPONE again (counting nothing) for a job waiting here for its
    client's delay, to a holder that may not know it; None otherwise."""
    if job.flags & FLAG_DELAYED and job.state == STATE_ACTIVE and job.qtime > now:
        return bus.Postpone(job.id, job.qtime - now, 0)
    return None


def broadcast_pause(node: JobHost, name: str, pause: Pause) -> None:
    """PAUSE ... BCAST: to every member, as the original broadcasts it to
    every node it knows. A leaving node still serves its queued jobs, so a
    pause out must reach it too (simulator seed 802408: a node made leaving
    just before a PAUSE out BCAST kept its queue serving); a failing one
    gets it if its link comes back in time."""
    for peer in node.cluster.members():
        node.effects.send(peer.node_id, bus.Pause(name, int(pause)))


# ------------------------------------------------------------ receiving


def receive(node: JobHost, sender: str, msg: object) -> None:
    """A job-level message from a known node."""
    handler = _HANDLERS.get(type(msg))
    if handler is not None:
        handler(node, sender, msg)


def receive_from_stranger(node: JobHost, sender: str, msg: object) -> None:
    """A message from a node that passed the bus handshake but is not in
    our table yet. Only QUEUED is heard: a replacement that took a job by
    YOURJOBS announces its queued copy to every holder it was given, often
    before gossip brought its new ID here. Dropped, the announcement left a
    holder to queue its own copy at RETRY, and both copies stayed queued
    until another holder's WILLQUEUE (simulator seed 20000403). The sender
    becomes a pending holder (added, and told of a copy queued here, once
    it answers our handshake: Node.adopt_pending_holders); our copy follows
    the QUEUED rule meanwhile, as for a known sender."""
    if type(msg) is not bus.Queued or sender in node.cluster.blacklist:
        return  # a forgotten node is not learned again for a minute
    job = node.jobs.get(msg.job_id)
    if job is None or job.state not in (STATE_ACTIVE, STATE_QUEUED):
        return
    merge_holders(node, job.nodes_delivered, (sender,), job.id)  # pending
    if job.state == STATE_QUEUED and compare_ids_by_job(sender, node.node_id, job.id) > 0:
        node.dequeue(job)
    _postpone_requeue(node, job)
    if job.state == STATE_ACTIVE:
        job.queued_on = sender


def _postpone_requeue(
    node: JobHost, job: Job, sender: str | None = None, working: bool = False
) -> None:
    """Another holder queued its copy: ours waits a whole RETRY again, and
    announces WILLQUEUE before it re-queues (a client's delay here is
    over: the job was queued elsewhere, so a re-queue here is a retry).
    But a job still waiting here for its client's delay keeps it when the
    ``sender`` (QUEUED, WORKING) can be told POSTPONE again, as at its
    WILLQUEUE: its QUEUED most often crossed our POSTPONE, which took its
    copy out of the queue (simulator seed 171: two holders queued the job
    at RETRY, one delivered it and its client asked for a DELAY 4; the
    other's QUEUED, sent before our POSTPONE reached it, ended the delay
    here, and the job was queued again at its RETRY, 1 s later)."""
    if sender is not None and (postpone := postpone_left(job, node.now_ms())) is not None:
        node.effects.send(sender, postpone)
        if working:
            # A client works on a copy there (a duplicate delivery): no
            # re-queue here while WORKING comes either, delay or not
            # (simulator seed 309453107: queued at the end of a NACK DELAY
            # 5 while another consumer held the job with WORKING).
            again = node.now_ms() + job.retry * 1000 + node.time_error()
            node.set_requeue_time(job, max(job.qtime, again))
        return
    job.flags &= ~(FLAG_DELAYED | FLAG_ANNOUNCE)
    if job.retry:
        job.flags |= FLAG_BCAST_WILLQUEUE
        now = node.now_ms()
        again = now + job.retry * 1000 + node.time_error()
        # A time further than any RETRY push (a stand-by for another node's
        # client delay, told by POSTPONE) is kept (simulator seed 300633: a
        # QUEUED sent before the POSTPONE reached its sender arrived after
        # it here, and cut this holder's stand-by to a RETRY).
        if job.qtime <= now + job.retry * 1000 + TIME_ERROR_MS:
            node.set_requeue_time(job, again)
        else:
            node.update_awake(job)


def _on_repljob(node: JobHost, sender: str, msg: bus.ReplJob) -> None:
    data = msg.job
    job = node.jobs.get(data.id)
    if job is None:
        if data.id in node.deleted_acked:
            # Acked and deleted here: the sender (an origin still waiting
            # for its copies, seed 158947) missed the ack. As for WILLQUEUE:
            # SETACK 0, it acks the job (its client gets the ID) and
            # collects it. Answered whatever our state.
            answer_deleted(node, sender, data.id)
            return
        if node.leaving or node.memory_level() > 0:
            return  # no new copies here: the sender will try another node
        if node.node_id not in data.nodes_delivered:
            # Not addressed to this node: sent to the ID it had before a
            # CLUSTER RESET HARD and delivered since. Its sender's DELJOB and
            # SETACK go to that old ID: a copy kept here would never go.
            return
        q = node.queues.get(data.queue)
        if q is not None and q.pause & PAUSED_IN:
            return
        if data.id in node.deleted_ids:
            return  # deleted here lately: a late copy would resurrect it
        job = job_from_data(node, data)
        job.flags |= FLAG_BCAST_QUEUED
        if sender in data.nodes_delivered:
            # From the node that added it and keeps a copy: it queues the
            # job (after its DELAY), unless told otherwise.
            job.queued_on = sender
        node.register(job)
    else:
        # A copy we hold: learn the holders added since, whatever our state
        # (paused in, leaving, short of memory refuse new copies only).
        before = job.nodes_delivered
        pending = pending_of(node, job.id)
        job.nodes_delivered = merge_holders(node, before, data.nodes_delivered, job.id)
        if job.state != STATE_WAIT_REPL and (
            job.nodes_delivered != before or pending_of(node, job.id) != pending
        ):
            # Recorded again: these holders may never speak to us, and a
            # copy reloaded without them would never tell them of its
            # queueing (seed 594353; records.job_record).
            node.persist(job)
        tell_new_holders(node, job, (n for n in job.nodes_delivered if n not in before))
    if not msg.noreply:
        node.effects.send(sender, bus.GotJob(data.id))


def _on_gotjob(node: JobHost, sender: str, msg: bus.GotJob) -> None:
    job = node.jobs.get(msg.job_id)
    if job is None or job.state != STATE_WAIT_REPL:
        return
    confirmed = job.nodes_confirmed or ()
    if sender not in confirmed:
        confirmed = job.nodes_confirmed = (*confirmed, sender)
    if sender not in job.nodes_delivered:
        job.nodes_delivered = (*job.nodes_delivered, sender)
    if len(confirmed) >= job.repl:
        replication_achieved(node, job)


def _on_enqueue(node: JobHost, sender: str, msg: bus.Enqueue) -> None:
    job = node.jobs.get(msg.job_id)
    if job is None or job.state not in (STATE_ACTIVE, STATE_WAIT_REPL):
        return
    q = node.queues.get(job.queue)
    if q is not None and q.pause & PAUSED_IN:
        return
    job.flags &= ~FLAG_BCAST_QUEUED
    if job.retry == 0:
        # At most once: a copy taken by REPLJOB never queues itself (qtime
        # 0), and this ENQUEUE, from the node that added it and kept no
        # copy (leaving, or short of memory), is its one queueing. Left at
        # 0, the job was answered and never delivered (issue 57).
        if job.flags & FLAG_DELIVERED or job.state != STATE_ACTIVE:
            return
        now = node.now_ms()
        job.qtime = now + msg.delay * 1000
        if msg.delay == 0:
            node.enqueue(job, now=now)
        else:
            node.update_awake(job, now=now)
        return
    # The other holders heard of the job from the node that added it, which
    # keeps no copy: they learn who queued it (a fail-over needs to know,
    # Node.fail_over), counting nothing.
    job.flags |= FLAG_ANNOUNCE
    if msg.delay == 0:
        node.enqueue(job)
    else:
        node.set_requeue_time(job, node.now_ms() + msg.delay * 1000)


def tell_acked(node: JobHost, peer: str, job_id: str) -> None:
    """SETACK without a holder count for a job acked and deleted here: a
    holder that missed the ack acks and collects its copy itself."""
    node.effects.send(peer, bus.SetAck(job_id, 0))


def answer_deleted(node: JobHost, sender: str, job_id: str) -> None:
    """A holder announces a job acked and deleted here lately: it missed the
    ack (its DELJOB after FASTACK or collection was lost, or we did not list
    it). SETACK without a holder count: it acks and collects it itself."""
    if job_id in node.deleted_acked:
        tell_acked(node, sender, job_id)
    elif job_id in node.deleted_refused:
        # Refused -NOREPL (here, or told so): the sender missed it.
        node.effects.send(sender, refused(node, sender, job_id))


def _on_queued(node: JobHost, sender: str, msg: bus.Queued | bus.Working) -> None:
    job = node.jobs.get(msg.job_id)
    if job is None:
        answer_deleted(node, sender, msg.job_id)
        return
    if job.state == STATE_ACKED:
        node.effects.send(sender, bus.SetAck(job.id, len(job.nodes_delivered)))
        return
    if sender not in job.nodes_delivered:
        _learned_holder(node, job, sender)
    working = isinstance(msg, bus.Working)
    if isinstance(msg, bus.Queued) and not msg.flags and _handed_within_retry(node, job):
        # A queued copy announced (counting nothing: moved by YOURJOBS, or
        # re-announced; a client's NACK or ENQUEUE counts) while a consumer
        # of ours has the job, within its RETRY here: a second copy queued
        # in a race, which the QUEUED rule, our copy queued no more, does
        # not settle. Tell the sender, as DELIVERED would have: it takes
        # its copy out of the queue (simulator seed 791906: two holders
        # queued the job at its retry point; one gave its copy away by a
        # slow YOURJOBS just before the other's QUEUED, which would have
        # dequeued it, came; the other delivered it, and the node the
        # YOURJOBS reached 0.5 s later queued it and delivered it again
        # 1.3 s into a RETRY of 37). Our copy stays as it is.
        _tell_one_delivered(node, job, sender)
        node.probe("queued-answered-delivered", job)
        return
    if job.state == STATE_QUEUED and (
        working or compare_ids_by_job(sender, node.node_id, job.id) > 0
    ):
        node.dequeue(job)
        node.probe("queued-caused-dequeue", job)
    elif job.state == STATE_QUEUED and not working:
        # Both queued and we keep ours: say so, or the sender (which may
        # have queued after our QUEUED reached it) keeps its copy queued too.
        # It loses the same comparison, so it dequeues and does not answer.
        node.effects.send(sender, bus.Queued(job.id, 0))
    _postpone_requeue(node, job, sender, working)
    # Queued there, or handed to a consumer there (WORKING: nothing to take
    # over if that node is lost; its consumer's RETRY stands).
    job.queued_on = sender if job.state == STATE_ACTIVE and not working else None
    job.flags &= ~FLAG_HANDED  # what our consumer had is news no more
    if isinstance(msg, bus.Queued):
        if msg.flags & bus.FLAG_INCR_NACKS:
            job.nacks += 1
        if msg.flags & bus.FLAG_INCR_DELIV:
            job.deliveries += 1


def _on_delivered(node: JobHost, sender: str, msg: bus.Delivered) -> None:
    """A holder handed the job to a consumer: no fail-over for it if that
    holder is lost, and no re-queue here before RETRY from now. Sent for
    every delivery, so the common case (a copy active here, no client delay
    of ours) only marks the copy: its timer, set for an earlier time, wakes
    and moves on to the later one (process_job), instead of being filed
    again now. Anything else is what WORKING does."""
    job = node.jobs.get(msg.job_id)
    if (
        job is not None
        and job.state == STATE_ACTIVE
        and job.flags & FLAG_DELAYED
        and sender in job.nodes_delivered
        and (postpone := postpone_left(job, node.now_ms())) is not None
    ):
        # Our client gave the job back with a delay: the delivery told
        # came before (a client gives back only what it got), most often
        # on another node than the one its NACK went to. The sender hears
        # the delay again; ours stands. Taken as WORKING, it pushed the
        # requeue a RETRY past the delay: Dramatiq's retry with a 1 s
        # back-off, on three nodes, came after the RETRY of 60 s.
        node.effects.send(sender, postpone)
        return
    if (
        job is None
        or job.state != STATE_ACTIVE
        or job.flags & FLAG_DELAYED
        or sender not in job.nodes_delivered
    ):
        _on_queued(node, sender, bus.Working(msg.job_id))
        return
    job.queued_on = None
    job.flags &= ~(FLAG_ANNOUNCE | FLAG_HANDED)
    if job.retry:
        job.flags |= FLAG_BCAST_WILLQUEUE
        again = node.now_ms() + job.retry * 1000 + node.time_error()
        if job.qtime < again:
            job.qtime = again


def _learned_holder(node: JobHost, job: Job, sender: str) -> None:
    """A node we did not list announced its copy (QUEUED, WORKING,
    WILLQUEUE): it got it from a holder we never heard from, through a
    YOURJOBS whose announcements a partition ate. Unlike the original, send
    it our holder list (a REPLJOB without reply merges it): it may not know
    the holders we know, and two queued copies that do not know of each
    other stay queued both (simulator seed 362). Sending the new list to
    every other holder as well (for seed 20000403, open) set off a message
    storm after a partition healed (seed 20009252)."""
    job.nodes_delivered = (*job.nodes_delivered, sender)
    now = node.now_ms()
    if ttl_ran_out(job, now):
        return  # it holds a copy of its own, which expires there
    if any(n != node.node_id and n != sender for n in job.nodes_delivered):
        node.effects.send(sender, bus.ReplJob(job_data(job, now), True))


def _on_willqueue(node: JobHost, sender: str, msg: bus.WillQueue) -> None:
    job = node.jobs.get(msg.job_id)
    if job is None:
        answer_deleted(node, sender, msg.job_id)
        return
    known = sender in job.nodes_delivered
    if job.state in (STATE_ACTIVE, STATE_QUEUED) and not known:
        _learned_holder(node, job, sender)
    if job.state == STATE_QUEUED:
        if known and (job.id in node.answered_queued or job.id in node.answered_queued_before):
            # Two holders announced it at once (their timers fell in one
            # chatter slot): the QUEUED that answered the first went to
            # every holder, this sender too, crossing its WILLQUEUE. A
            # second answer would say the same (two messages more for
            # about a third of the jobs held, each retry period).
            return
        # To every holder, not just the sender: another one may have queued
        # its copy too, without either of us knowing (a lost QUEUED). In
        # steady state this answer is what spares the re-announcement at
        # our next retry point (FLAG_TOLD_QUEUED); a queueing's own
        # announcement does not (Node.enqueue, _on_yourjobs), since a lost
        # one is then repeated a retry period sooner (seed 20005489).
        announce_queued(node, job)
        job.flags |= FLAG_TOLD_QUEUED
        node.answered_queued.add(job.id)
        node.probe("willqueue-answered-queued", job)
    elif job.state == STATE_ACKED:
        node.effects.send(sender, bus.SetAck(job.id, len(job.nodes_delivered)))
    elif (postpone := postpone_left(job, node.now_ms())) is not None:
        # The sender missed our POSTPONE (its RETRY came first): it holds
        # its copy past our delay instead of queueing it now.
        node.effects.send(sender, postpone)
        node.probe("willqueue-answered-postpone", job)
    elif _handed_within_retry(node, job):
        # A consumer of ours has it, within its RETRY here, and the sender
        # never heard (holder lists that diverged: a wipe, a partition;
        # simulator seed 721927, delivered again 3 s into a RETRY of 22):
        # tell it, as DELIVERED would have.
        _tell_one_delivered(node, job, sender)
        node.probe("willqueue-answered-delivered", job)


def _handed_within_retry(node: JobHost, job: Job) -> bool:
    """A consumer of ours has the job (handed here, not given back or
    queued anywhere since, as far as we heard), within its RETRY here."""
    return bool(
        job.state == STATE_ACTIVE
        and job.flags & FLAG_HANDED
        and not job.flags & FLAG_DELAYED
        and job.retry
        and job.qtime > node.now_ms()
    )


def _on_postpone(node: JobHost, sender: str, msg: bus.Postpone) -> None:
    job = node.jobs.get(msg.job_id)
    if job is None:
        if msg.job_id in node.deleted_ids:
            answer_deleted(node, sender, msg.job_id)
        else:
            remember_postpone(node, sender, msg)
        return
    if job.state == STATE_ACKED:
        node.effects.send(sender, bus.SetAck(job.id, len(job.nodes_delivered)))
        return
    if job.state not in (STATE_ACTIVE, STATE_QUEUED):
        return
    remember_postpone(node, sender, msg)
    if sender not in job.nodes_delivered:
        _learned_holder(node, job, sender)
    relayed = msg.flags & bus.FLAG_RELAYED
    # The sender queues the job at the end of the delay; a relayed POSTPONE
    # does not name the node that does.
    job.queued_on = None if relayed else sender
    if not relayed:
        _relay_postpone(node, job, sender, msg.delay_ms)
    if job.state == STATE_QUEUED:
        # Queued here too (a lost QUEUED): the client asked for the delay,
        # so this copy waits as well; the sender queues the job.
        node.dequeue(job)
        node.probe("postpone-caused-dequeue", job)
    # A client asked for a delay: whatever a consumer of ours had is given
    # back (seed 730332: a WILLQUEUE answered DELIVERED for a job NACKed
    # with a DELAY held its requeue a RETRY past the delay), and its
    # delivery is news no more (the next cron would tell it DELIVERED).
    job.flags &= ~FLAG_HANDED
    node.delivered_untold.pop(job.id, None)
    if job.retry:
        job.flags |= FLAG_BCAST_WILLQUEUE
        now = node.now_ms()
        if job.flags & FLAG_DELAYED and (
            relayed or compare_ids_by_job(sender, node.node_id, job.id) < 0
        ):
            # Waiting for a delay of our own client's too (two consumers got
            # the job, each asked a holder for a delay): one of the two
            # queues it, at the later of the two ends; the other stands by.
            # Both standing by, each holder's WILLQUEUE, answered with a
            # POSTPONE, pushed the other a RETRY further, for ever
            # (simulator seed 12: coda-1, NACK DELAY 2 on n0 and on n2,
            # never queued again). The per-job comparison picks the one,
            # as for two queued copies. A relayed POSTPONE does not name the
            # node that took the other delay: ours is kept, to the later end,
            # and a second queued copy is settled by the QUEUED rule.
            standby = now + msg.delay_ms
        else:
            job.flags &= ~FLAG_DELAYED  # the sender queues it
            standby = now + msg.delay_ms + job.retry * 1000 + node.time_error()
        node.set_requeue_time(job, max(job.qtime, standby))
    if msg.flags & bus.FLAG_INCR_NACKS:
        job.nacks += 1
    if msg.flags & bus.FLAG_INCR_DELIV:
        job.deliveries += 1


def _relay_postpone(node: JobHost, job: Job, sender: str, delay_ms: int) -> None:
    """Pass a POSTPONE on to the other holders listed here (not the sender):
    the sender's list may lack some. A holder that gave its queued copy away
    by YOURJOBS twice, to the sender and then to a third node, lists both;
    the sender, which took the job before the second, lists only itself and
    the giver (simulator seed 520552: n0's NACK DELAY 5 told n2 only, and
    n1, given the job by n2's late YOURJOBS, delivered it 0.3 s into the
    delay). A relayed POSTPONE counts nothing (a holder the sender lists
    hears it twice) and is not relayed again; it goes only to nodes that
    know the flag (bus protocol 7)."""
    if delay_ms <= 0:
        return
    msg = bus.Postpone(job.id, delay_ms, bus.FLAG_RELAYED)
    for node_id in job.nodes_delivered:
        if node_id in (sender, node.node_id):
            continue
        peer = node.cluster.nodes.get(node_id)
        if peer is not None and peer.bus_version >= bus.RELAY_VERSION:
            node.effects.send(node_id, msg)


def remember_postpone(node: JobHost, sender: str, msg: bus.Postpone) -> None:
    """A POSTPONE heard, kept until its delay ends (at most
    POSTPONES_HEARD_MAX of them, the oldest go first), for a YOURJOBS
    written before its sender heard of the delay, which must not queue the
    job during it (_on_yourjobs):

    * for a job not held here, the YOURJOBS that gives it to us may still
      be on its way, overtaken by the POSTPONE its sender wrote after it
      (simulator seed 458330: a NEEDJOBS answered with the job, then its
      client's ENQUEUE DELAY 2 there; the POSTPONE came first and was
      dropped, and the YOURJOBS, 0.4 s later, queued the job 0.5 s into
      the delay): the job it brings is held past the delay;
    * for a job held here, standing by for the delay, a YOURJOBS from a
      third holder that gave its queued copy away before the POSTPONE
      reached it (simulator seed 472635: delivered here 0.5 s into a
      NACK DELAY 3 asked on another node) leaves it standing by."""
    if msg.delay_ms <= 0:
        return
    now = node.now_ms()
    heard = node.postpones_heard
    before = heard.pop(msg.job_id, None)
    if (
        msg.flags & bus.FLAG_RELAYED
        and before is not None
        and not before[1] & bus.FLAG_RELAYED
        and before[0] > now
    ):
        # A relay of the delay its owner told us of already: the owner,
        # which queues the job at its end, stays the one remembered.
        heard[msg.job_id] = (max(before[0], now + msg.delay_ms), before[1], before[2])
    else:
        heard[msg.job_id] = (now + msg.delay_ms, msg.flags, sender)
    while heard:
        oldest, (until, _, _) = next(iter(heard.items()))
        if len(heard) <= POSTPONES_HEARD_MAX and until > now:
            break
        del heard[oldest]


def _apply_postpone_heard(node: JobHost, job: Job, now: int) -> bool:
    """A job that just came by YOURJOBS, with a POSTPONE that came before it
    (remember_postpone): held past the delay, as if the POSTPONE came
    now, and counted as it says. True if it applied."""
    heard = node.postpones_heard.pop(job.id, None)
    if heard is None or not job.retry:
        return False
    until, flags, sender = heard
    if until <= now:
        return False
    node.probe("early-postpone-applied", job)
    _on_postpone(node, sender, bus.Postpone(job.id, until - now, flags))
    return True


def _postponed_elsewhere(node: JobHost, job: Job, now: int, sender: str, nacks: int) -> bool:
    """A client's delay told by POSTPONE still runs, but for a YOURJOBS
    from the node that owns it, sent once it knew of it (``nacks``, the
    count it sent, has the NACK our copy counted): the owner queues the job
    at the delay's end, and that YOURJOBS comes from that queueing. Taken
    for a copy from the delay, it left the job active on every holder,
    queued nowhere, until its RETRY (a relayed POSTPONE, a few ms late,
    outlived the owner's: Dramatiq's retries on three nodes waited 60 s
    instead of their back-off). One written before the POSTPONE and
    overtaken by it stands by (simulator seed 458330)."""
    heard = node.postpones_heard.get(job.id)
    if heard is None or heard[0] <= now:
        return False
    owner = heard[2] == sender and not heard[1] & bus.FLAG_RELAYED
    return not (owner and nacks >= job.nacks)


def _on_setack(node: JobHost, sender: str, msg: bus.SetAck) -> None:
    job = node.jobs.get(msg.job_id)
    if job is not None and job.state == STATE_WAIT_REPL:
        # Queued, it would go at once to a blocked GETJOB, before the
        # acknowledge below (a delivery of a job known to be acked).
        replication_achieved(node, job, acked=True)
        if node.jobs.get(msg.job_id) is not job:
            job = None  # replicated externally: no copy here, forgotten as acked
    if job is not None:
        node.acknowledge(job)
        if msg.may_have and sender not in job.nodes_delivered and not job.is_dummy_ack:
            # The sender acked a copy of its own we did not list: our lists
            # differ, and the count alone would say it knows every holder we
            # know. Counted in, ours is longer if it misses one of them, and
            # we collect the job ourselves (simulator seed 490313: a holder
            # restarted without the node it had copied the job to, copied it
            # to a third; the first one's SETACK was answered by counts, the
            # third kept its copy after the collection).
            job.nodes_delivered = (*job.nodes_delivered, sender)
    if job is None and msg.job_id not in node.deleted_acked:
        # Acked, and no copy here (yet): remembered as acked, like a DELJOB
        # for a job not held, so that a REPLJOB still on its way is refused
        # (answered SETACK). A RETRY 0 copy taken late never announces
        # itself, so nothing would ever collect it (simulator seed 2400: an
        # ADDJOB on a leaving node copied to a node cut off one way, whose
        # first REPLJOB arrived after the SETACK, and the DELJOB was lost).
        node.remember_deleted(msg.job_id, acked=True)
    if job is None or len(job.nodes_delivered) <= msg.may_have:
        node.effects.send(sender, bus.GotAck(msg.job_id, job is not None))
        return
    if msg.may_have == 0:
        node.effects.send(sender, bus.GotAck(msg.job_id, True))
    node.try_gc(job)


def _on_gotack(node: JobHost, sender: str, msg: bus.GotAck) -> None:
    job = node.jobs.get(msg.job_id)
    if job is None or job.state != STATE_ACKED:
        return
    dummy = job.is_dummy_ack
    if dummy and msg.known:
        node.unregister(job)  # a holder knows it: collecting is its job now
        return
    if msg.known or sender in job.nodes_delivered:
        if sender not in job.nodes_delivered:
            job.nodes_delivered = (*job.nodes_delivered, sender)
        if job.nodes_confirmed is not None and sender not in job.nodes_confirmed:
            job.nodes_confirmed = (*job.nodes_confirmed, sender)
    if dummy:
        confirmed = job.nodes_confirmed or node.myself_only
        if sender not in confirmed:
            confirmed = (*confirmed, sender)
        job.nodes_confirmed = confirmed
        if len(confirmed) >= len(node.cluster.nodes):
            node.unregister(job)
            # Every node said it held no copy, but one may have got a copy
            # after it answered (by YOURJOBS from a node that had not
            # answered yet: simulator seed 563819, a later ACKJOB here
            # answered 0 from the tombstone and told nobody). The tombstone
            # gets no epoch: a later ACKJOB makes a dummy ack again.
            node.deleted_acked[job.id] = NO_EPOCH
        return
    if job.nodes_confirmed is not None and set(job.nodes_delivered) <= set(job.nodes_confirmed):
        _deljob_to_holders(node, job)
        node.probe("ack-collected", job)
        node.unregister(job)


def _on_deljob(node: JobHost, sender: str, msg: bus.DelJob) -> None:
    # A DELJOB means the job is done for good (acked and collected, FASTACKed,
    # or its ADDJOB failed): remember it as acked, so that a holder the
    # DELJOB missed (cut off by a partition), announcing its copy later, is
    # told to ack it (simulator seed 510: the FASTACKing node crashed and
    # forgot; the nodes that took its DELJOB kept silent while the copy was
    # queued for ever).
    job = node.jobs.get(msg.job_id)
    if job is not None:
        if job.state == STATE_WAIT_REPL:
            # Our own ADDJOB still waiting: a DELJOB is a stray (FASTACK
            # elsewhere); keep waiting, the timeout decides.
            return
        node.unregister(job, acked=True)
    else:
        # Not here (yet): its REPLJOB may still be on its way.
        node.remember_deleted(msg.job_id, acked=True)


def _on_refused(node: JobHost, sender: str, msg: bus.Refused) -> None:
    """The job's ADDJOB was answered -NOREPL: like DELJOB, the copy goes
    and a late one is refused, but nobody acked it (unless a client did
    here: a holder that queued it at its RETRY before hearing this)."""
    job = node.jobs.get(msg.job_id)
    if job is not None:
        if job.state == STATE_WAIT_REPL:
            return  # our own ADDJOB's ID: a stray, as for DELJOB
        node.unregister(job)
    elif msg.job_id not in node.deleted_ids:
        node.remember_deleted(msg.job_id)
    if msg.job_id in node.deleted_ids:
        node.deleted_refused.add(msg.job_id)


def _on_pause(node: JobHost, sender: str, msg: bus.Pause) -> None:
    node.set_pause(msg.queue, Pause(msg.flags & 3))


# ------------------------------------------------------------ federation


def need_jobs(node: JobHost, name: str, reached_zero: bool = False) -> None:
    """Ask other nodes for jobs of a queue our clients wait on."""
    if node.leaving or node.cluster_size <= 1:
        return
    now = node.now_ms()
    q = node.queue(name, now)
    rate = q.import_rate(now)
    if reached_zero and rate == 0:
        return
    responders = _valid_responders(node, q, now)
    to_fetch = _to_fetch(rate, len(responders))
    bcast_delay = min(NEEDJOBS_BCAST_MIN_MS << q.needjobs_bcast_attempt, NEEDJOBS_BCAST_MAX_MS)
    if now - q.needjobs_bcast_ms > bcast_delay:
        q.needjobs_bcast_ms = now
        q.needjobs_bcast_attempt = min(q.needjobs_bcast_attempt + 1, 16)
        q.needjobs_bcast_seq = node.link_seq
        q.needjobs_told.clear()
        # Every member, leaving ones included (like the original): a leaving
        # node gives its queued jobs away when asked, and nobody else would
        # ever fetch them.
        for peer in node.cluster.members():
            node.effects.send(peer.node_id, bus.NeedJobs(name, 1))
    else:
        # A peer that linked (restarted) since that broadcast never heard
        # our consumers wait: asked now, once, it tells us when it has jobs
        # (HAVEJOBS), instead of after our broadcast back-off, up to
        # NEEDJOBS_BCAST_MAX_MS (simulator seed 722689: a job queued on a
        # restarted node waited 3.4 s while another node's consumers
        # waited, asking only the node that had answered them before).
        for node_id in _unasked_peers(node, q):
            q.needjobs_told[node_id] = node.linked_at[node_id]
            node.effects.send(node_id, bus.NeedJobs(name, 1))
    adhoc_delay = min(NEEDJOBS_ADHOC_MIN_MS << q.needjobs_adhoc_attempt, NEEDJOBS_ADHOC_MAX_MS)
    if responders and (reached_zero or now - q.needjobs_adhoc_ms > adhoc_delay):
        q.needjobs_adhoc_ms = now
        q.needjobs_adhoc_attempt = min(q.needjobs_adhoc_attempt + 1, 16)
        for node_id in responders:
            node.effects.send(node_id, bus.NeedJobs(name, to_fetch))


def _unasked_peers(node: JobHost, q: Queue) -> list[str]:
    """Peers whose link came up since the queue's last NEEDJOBS broadcast,
    not asked for its jobs since."""
    since = q.needjobs_bcast_seq
    told = q.needjobs_told
    nodes = node.cluster.nodes
    return [
        node_id
        for node_id, linked in node.linked_at.items()
        if linked > since
        and told.get(node_id, 0) < linked
        and (peer := nodes.get(node_id)) is not None
        and not peer.flags & NOT_REACHABLE
    ]


def _to_fetch(rate: int, responders: int) -> int:
    """How many jobs an ad-hoc NEEDJOBS asks each source for: the queue's
    import rate shared among them, within bounds."""
    to_fetch = rate // responders if responders else NEEDJOBS_MIN_REQUEST
    return min(max(to_fetch, NEEDJOBS_MIN_REQUEST), NEEDJOBS_MAX_REQUEST)


def ask_again_for_waiting_queues(node: JobHost, peers: Iterable[str]) -> None:
    """Links to ``peers`` came up (again): each hears NEEDJOBS for every
    queue our consumers wait on with nothing queued here. A peer that
    restarted forgot who asked it for jobs (it tells the nodes that did as
    soon as it has some: HAVEJOBS), and ours would otherwise ask again only
    at its broadcast back-off, up to NEEDJOBS_BCAST_MAX_MS later."""
    for peer in peers:
        node.link_seq += 1
        node.linked_at[peer] = node.link_seq
    if node.leaving:
        return
    waiting = sorted(name for name, q in node.queues.items() if q.waiters and not q.jobs)
    for peer in peers:
        for name in waiting:
            node.queues[name].needjobs_told[peer] = node.linked_at[peer]
            node.effects.send(peer, bus.NeedJobs(name, 1))


def tell_interested(node: JobHost, q: Queue, now: int) -> None:
    """A job was queued here and none of our consumers waits on its queue:
    the nodes that asked for jobs of it lately (NEEDJOBS) hear HAVEJOBS, at
    most one every HAVEJOBS_MIN_INTERVAL_MS, and ask for them at once if
    their consumers still wait. A node whose consumers wait for a long time
    asks again only every NEEDJOBS_BCAST_MAX_MS (30 s): the job waited for
    that (issue 57: an idle consumer on another node got a job after 19 to
    23 s, as with the original)."""
    if q.pause & PAUSED_OUT or q.import_rate(now) > 0:
        return  # we would not give them (_on_needjobs)
    mono = node.clock.mono_ms()
    interested = _fresh_interest(node, q.name, mono)
    for node_id, (heard, told) in interested.items():
        if mono - told >= HAVEJOBS_MIN_INTERVAL_MS:
            interested[node_id] = (heard, mono)
            node.effects.send(node_id, bus.HaveJobs(q.name))


def forget_stale_interest(node: JobHost) -> None:
    """Drop the interested nodes heard from too long ago (the cron)."""
    mono = node.clock.mono_ms()
    for name in list(node.interest):
        _fresh_interest(node, name, mono)


def _fresh_interest(node: JobHost, name: str, mono: int) -> dict[str, tuple[int, int]]:
    """The nodes interested in a queue, those heard from too long ago
    dropped (and the queue's entry, once none is left)."""
    interested = node.interest[name]
    for node_id, (heard, _) in list(interested.items()):
        if mono - heard > INTEREST_MS:
            del interested[node_id]
    if not interested:
        del node.interest[name]
    return interested


def _remember_interest(node: JobHost, sender: str, name: str) -> None:
    """A NEEDJOBS from ``sender``: tell it when jobs of the queue come here
    (tell_interested), if it speaks HAVEJOBS."""
    peer = node.cluster.nodes.get(sender)
    if peer is None or peer.bus_version < bus.HAVEJOBS_VERSION:
        return
    interested = node.interest.get(name)
    if interested is None:
        interested = node.interest[name] = {}
    told = interested.get(sender, (0, -HAVEJOBS_MIN_INTERVAL_MS))[1]
    interested[sender] = (node.clock.mono_ms(), told)


def _on_havejobs(node: JobHost, sender: str, msg: bus.HaveJobs) -> None:
    """The sender has jobs of a queue we asked for: if our consumers still
    wait on it with nothing queued here, ask it now, as a source."""
    q = node.queues.get(msg.queue)
    if q is None or node.leaving:
        return
    now = node.now_ms()
    # A source, even while none of our consumers waits: between two GETJOBs
    # of a consumer in a loop nobody does, and the next one to block asks
    # it at once (need_jobs: responders), not at the broadcast back-off.
    q.needjobs_responders[sender] = now // 1000
    q.needjobs_adhoc_attempt = 0
    if not q.waiters or q.jobs:
        return
    q.needjobs_adhoc_ms = now
    rate = q.import_rate(now)
    node.effects.send(sender, bus.NeedJobs(q.name, _to_fetch(rate, len(q.needjobs_responders))))


def needjobs_due(node: JobHost, name: str) -> int | None:
    """When :func:`need_jobs` next has something to send for this queue
    (node-time ms), or None: nobody waits, jobs are here, or there is no
    one to ask. The queue's delivery task sleeps until then."""
    q = node.queues.get(name)
    if q is None or not q.waiters or q.jobs or node.leaving or node.cluster_size <= 1:
        return None
    bcast_delay = min(NEEDJOBS_BCAST_MIN_MS << q.needjobs_bcast_attempt, NEEDJOBS_BCAST_MAX_MS)
    due = q.needjobs_bcast_ms + bcast_delay + 1
    if node.linked_at and _unasked_peers(node, q):
        return node.now_ms()  # a peer linked since the broadcast: ask it now
    if q.needjobs_responders:
        adhoc_delay = min(NEEDJOBS_ADHOC_MIN_MS << q.needjobs_adhoc_attempt, NEEDJOBS_ADHOC_MAX_MS)
        due = min(due, q.needjobs_adhoc_ms + adhoc_delay + 1)
    return due


def _valid_responders(node: JobHost, q: Queue, now: int) -> list[str]:
    now_s = now // 1000
    for node_id, seen in list(q.needjobs_responders.items()):
        if now_s - seen > RESPONDER_VALIDITY_S:
            del q.needjobs_responders[node_id]
    return sorted(q.needjobs_responders)


def queue_drained(node: JobHost, q: Queue) -> None:
    need_jobs(node, q.name, reached_zero=True)


def _on_needjobs(node: JobHost, sender: str, msg: bus.NeedJobs) -> None:
    _remember_interest(node, sender, msg.queue)
    q = node.queues.get(msg.queue)
    if q is None or not q.jobs or q.pause & PAUSED_OUT:
        return
    now = node.now_ms()
    if q.import_rate(now) > 0:
        return  # we import this queue ourselves: do not ping-pong jobs
    count = msg.count
    if len(q.jobs) < count * 2:
        count = len(q.jobs) // 2
    count = max(1, min(count, NEEDJOBS_MAX_REQUEST))
    jobs: list[Job] = []
    while len(jobs) < count:
        job = node.take_oldest(q)
        if job is None:
            break
        if ttl_ran_out(job, now):
            # It expires here instead (seed 107705: a RETRY 0 job with TTL 7
            # moved 7.5 s after its ADDJOB, delivered there after 8.6 s).
            node.expire(job)
            continue
        if job.retry and sender not in job.nodes_delivered:
            # Unlike the original, remember where the copy went: an ack
            # made anywhere must reach it, or it comes back after the job
            # was collected everywhere else. Recorded, so that a restart
            # remembers it too (seed 490313: reloaded without the node it
            # had given the job to, this node answered that node's SETACK
            # as if it knew no other holder).
            job.nodes_delivered = (*job.nodes_delivered, sender)
            node.persist(job)
        jobs.append(job)
    # The TTLs a YOURJOBS carries are what is left in this second of the
    # wall clock (whole seconds): written in a later one, it would give the
    # jobs more. A RETRY 0 job leaves this node with it: late, not never; so
    # those go in a YOURJOBS of their own, with no limit. Sharing one, the
    # others rode along late too (simulator seed 172906: a YOURJOBS with a
    # RETRY 0 job waited 4.3 s for a link, and a TTL 6 job it carried was
    # delivered 8.34 s after its ADDJOB).
    moved = [j for j in jobs if j.retry == 0]
    copied = [j for j in jobs if j.retry] if moved else jobs
    # The holders still in their handshake here travel too: a RETRY 0 job
    # is forgotten here as it moves, and with it the one record of them
    # (simulator seed 761608: a copy an ADDJOB on a leaving node sent to a
    # node cut off one way arrived after the job was acked on the node it
    # moved to, which never heard of that holder; the copy stayed there,
    # acked nowhere, until its TTL).
    if copied:
        answer = bus.YourJobs(tuple(job_data(j, now, pending_of(node, j.id)) for j in copied))
        node.effects.send(sender, answer, rest_of_second(now))
    if moved:
        answer = bus.YourJobs(tuple(job_data(j, now, pending_of(node, j.id)) for j in moved))
        node.effects.send(sender, answer)
    for job in jobs:
        if job.retry == 0:
            node.hand_over(job, follow=True)  # at most once: it now lives there only
        else:
            node.update_awake(job)
    if not q.jobs:
        node.schedule_queue_gc(q)


def _on_yourjobs(node: JobHost, sender: str, msg: bus.YourJobs) -> None:
    now = node.now_ms()
    for data in msg.jobs:
        job = node.jobs.get(data.id)
        if job is None and data.id in node.deleted_acked:
            # Acked and deleted here lately (the YOURJOBS crossed our ack, or
            # the sender lost the ack in a crash): not again; the sender
            # keeps a copy, tell it about the ack. Unlike the original, the
            # sender still counts as a source of the queue: it holds queued
            # jobs of it, and the next ad-hoc NEEDJOBS comes in 25 ms, not
            # after the broadcast back-off (up to 30 s), which a few such
            # stale copies at the head of its queue would otherwise stretch
            # while its live jobs wait (simulator seed 71).
            answer_deleted(node, sender, data.id)
            _count_responder(node, sender, data.queue, now)
            continue
        if job is None and data.id in node.deleted_expired:
            # Its TTL ran out here: a copy the network held back since (the
            # TTL travels as what is left of it) must not bring it back to
            # life (simulator seed 20: a YOURJOBS stalled 4 s by a one-way
            # partition, delivered 3 s after the TTL). The sender still
            # counts as a source of the queue, as above: a sender whose
            # clock runs behind keeps the job queued past its TTL, at the
            # head of its queue (lowest ctime), and would answer every
            # NEEDJOBS with it alone; left uncounted, its live jobs wait
            # out the broadcast back-off, up to 30 s (simulator seed 133855:
            # a clock 36.5 s behind, 16 jobs never delivered).
            _count_responder(node, sender, data.queue, now)
            continue
        if job is None and data.id in node.deleted_refused:
            # Its ADDJOB here was answered -NOREPL (replication_timed_out).
            answer_deleted(node, sender, data.id)
            _count_responder(node, sender, data.queue, now)
            continue
        if job is None:
            job = job_from_data(node, data)
            node.register(job)
            if job.retry == 0:
                job.qtime = now  # any non-zero value lets enqueue() accept it
                job.flags &= ~FLAG_DELIVERED
            elif node.postpones_heard and _apply_postpone_heard(node, job, now):
                continue
        elif job.retry == 0:
            if job.state != STATE_ACTIVE or job.flags & FLAG_DELIVERED:
                continue  # a duplicate or late copy: at most once, never again
            # A copy here that never left a queue of ours: an extra copy of
            # an external replication (a leaving node adds one more holder
            # while the first GOTJOB is slow, then ENQUEUEs the job on one
            # of them). The sender moved the one queued copy here and
            # forgot it: this is its queueing. Dropped as a duplicate, the
            # job was answered and never delivered (simulator seed 6752).
            job.qtime = now  # any non-zero value lets enqueue() accept it
        else:
            job.nodes_delivered = merge_holders(
                node, job.nodes_delivered, data.nodes_delivered, job.id
            )
            if (again := postpone_left(job, now)) is not None:
                # Waiting here for its client's NACK or ENQUEUE DELAY: a
                # YOURJOBS sent before the sender heard our POSTPONE (it
                # queued its copy again and gave it away meanwhile) must
                # not end the delay (simulator seed 320491137, a YOURJOBS
                # slowed by the BUGGIFY knob: delivered 0.3 s into a 2 s
                # delay). The sender holds its copy past it.
                node.effects.send(sender, again)
                continue
            if job.state == STATE_ACTIVE and _postponed_elsewhere(
                node, job, now, sender, data.nacks
            ):
                # Standing by for another holder's client delay (remember_postpone).
                node.probe("yourjobs-during-postpone", job)
                continue
        # A job moving between queues is not delivered again: queue it as a
        # first queueing, which counts nothing.
        job.flags &= ~FLAG_BCAST_QUEUED
        if not node.enqueue(job, now=now):
            continue
        if job.retry:
            # Unlike the original, tell the other holders (counting nothing):
            # one of them may have queued its own copy meanwhile, and may not
            # know this node holds one (the QUEUED rule then leaves a single
            # copy queued).
            announce_queued(node, job)
        node.probe("yourjobs-moved-a-job", job)
        q = _count_responder(node, sender, job.queue, now)
        q.count_import(now)


def _count_responder(node: JobHost, sender: str, name: str, now: int) -> Queue:
    """The sender gave us jobs of a queue: ask it first from now on."""
    q = node.queue(name, now)
    if sender not in q.needjobs_responders:
        q.needjobs_bcast_attempt = 0
    q.needjobs_responders[sender] = now // 1000
    q.needjobs_adhoc_attempt = 0
    if q.waiters:
        node.wake_queue(q)  # its delivery task sleeps until an older deadline
    return q


_HANDLERS: dict[type, Callable[[JobHost, str, Any], None]] = {
    bus.ReplJob: _on_repljob,
    bus.GotJob: _on_gotjob,
    bus.Enqueue: _on_enqueue,
    bus.Queued: _on_queued,
    bus.Working: _on_queued,
    bus.Delivered: _on_delivered,
    bus.WillQueue: _on_willqueue,
    bus.SetAck: _on_setack,
    bus.GotAck: _on_gotack,
    bus.DelJob: _on_deljob,
    bus.Refused: _on_refused,
    bus.NeedJobs: _on_needjobs,
    bus.HaveJobs: _on_havejobs,
    bus.YourJobs: _on_yourjobs,
    bus.Pause: _on_pause,
    bus.Postpone: _on_postpone,
}
