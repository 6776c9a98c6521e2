"""Black-box checks over a workload history (Jepsen's total-queue, adapted
to Disque's guarantees), plus the end-of-run liveness checks.

Every check of a run, one line each: the property it guards, and where it
runs when it needs more than the history (a violation starts with its name).

Here, over the client history:
- (no name: ``check``) no job acknowledged by ADDJOB is lost, nothing is
  delivered that was never added, before its DELAY or after its TTL, and a
  RETRY 0 job is delivered at most once;
- ``requeue-timely``: a job not acked is delivered again within RETRY plus
  an allowance after its last delivery, once healed;
- ``nack-prompt``: a NACKed job is queued again within 1 s, absent faults;
- ``working-holds``: no re-queue or re-delivery while WORKING keeps coming;
- ``ack-final``: an ack in a calm cluster (dummy acks included) is final;
- ``answered``: every pipelined ADDJOB gets its reply once faults heal;
- ``nack-delay-holds``: no node delivers a job NACKed/ENQUEUEd with DELAY d
  before d (less the clock allowance) after the answer, absent faults;
- ``nack-delay-ends``: such a job, not acked, is queued again within d plus
  an allowance, absent faults, consumers on;
- ``retry0-refused``: NACK/ENQUEUE (DELAY or not) of a delivered RETRY 0 job
  is never answered 1;
- ``waitjob-true``: WAITJOB says ``acked`` only after some ACKJOB/FASTACK was
  sent, never ``gone`` for a job acked before the call (calm), and a call
  blocked on the jobs' creator answers within 1 s of their acks' replies;
- ``failover-holds``: a job its consumer keeps (WORKING, moved to another
  node when its own went down; or a long RETRY job worked on within its
  retry point) is neither queued nor delivered again until its ack, calm
  or with a crash of the node it came from as the only fault.

Over node state, in ``sim/world.py`` (its module docstring says more):
- ``acked-absorbing``: a node that acked a job never queues it again;
- ``retry0-once``: a RETRY 0 job is queued at most once per node;
- ``always-no-amnesia``: under ``appendfsync always`` a crash forgets no job;
- ``everysec-window``: under ``everysec`` a crash loses only its last writes;
- ``aof-keeps-ttl``: a job reloaded from the AOF keeps its expire time;
- ``ttl-expires``: no node holds a job past its TTL;
- ``expired-stays-expired``: a node never takes back a copy it expired;
- ``queued-iff-in-queue``: QUEUED exactly when in the queue;
- ``single-queued``: no job queued on two nodes for long in a healthy cluster;
- ``pause-in``: a node paused in stores no replicated copy;
- ``collected-everywhere``: a collected ack leaves every holder;
- ``holders-know-holders``: a holder lists the other holders;
- ``replication-counts-nodes``: a sync ADDJOB's wait ends at REPLICATE nodes;
- ``fail-detected``: a node cut off past the node timeout is FAIL for the
  majority within a bound;
- ``nack-delay-told``: shortly after a NACK/ENQUEUE DELAY (healthy cluster)
  no other holder has the job queued, each holds it past d + RETRY;
- ``nack-delay-timed``: the node that took the delay has its timer by then;
- ``aof-keeps-delay``: a job reloaded within its client's delay keeps it;
- ``failover-timely``: the jobs a node cut off (crash, wipe, isolation,
  freeze) had queued are queued by a surviving holder within 2 s of the
  first of them flagging it FAIL, or of hearing it restarted;
- ``failover-once``: then, not by two holders at once (one is chosen, the
  others stand by);
- ``delivery-told``: shortly after a delivery (healthy cluster), the job's
  other holders hold it past RETRY from the delivery and would not take it
  over if its node were lost;
- ``federation-prompt``: in the calm coda, a job queued on a node with no
  consumer of its own reaches another node whose consumer waits, within
  six network delays and a margin;
- ``message-storm``, ``run-finishes``: the bus and the run stay bounded.

What users observe (issue #45), in ``sim/observing.py`` (its docstring
says more) unless named otherwise; each guards a promise of the protocol:
- ``order``: on one node, each GETJOB takes the oldest job queued there
  for that queue (a queue is ordered by creation time);
- ``counters-follow``: ``nacks`` and ``additional-deliveries`` never go
  down on a node holding the job, and a copy a REPLJOB or YOURJOBS made
  has at least the counters it carried (across holders they are best
  effort: counts travel as increments, see the module);
- ``retry0-once-cluster``: a RETRY 0 job is handed to a client at most
  once in the cluster, whatever path could queue it again (the workload
  NACKs and ENQUEUEs RETRY 0 jobs too: ``retry0-refused`` above, and the
  loss check's "delivered N times");
- ``rewrite-keeps-state``: after every AOF rewrite (BGREWRITEAOF, the
  automatic one, SHUTDOWN REWRITE-AOF), loading the new file gives the
  jobs, acked states (dummy acks included), counters, expire times and
  client DELAY times that loading the old file gives;
- ``pause-bcast`` (``sim/explore.py``): PAUSE ... BCAST in a calm cluster
  reaches every node the sender could reach and acts there (the queue
  created if the node had none; clients blocked there served once its
  output is resumed);
- ``leaving-known`` (``sim/explore.py``): CLUSTER LEAVING is flagged by
  every other node within half the node timeout plus
  ``LEAVING_KNOWN_S`` once calm (each peer is pinged that often);
  ``leaving-no-copies``: a leaving node stores no new REPLJOB copy (the
  explorer adds a job for every node as one starts leaving);
- the node's own rules, ``always-*`` (``disque_trio/core/always.py``,
  checked at every job event and monitor sample, off outside the
  simulator): ``always-collect-after-confirms`` (GOTACK rule: collected
  only once every holder it knows of confirmed), ``always-no-queue-over-
  tombstone`` (DELJOB rule: never queue a job whose acked tombstone is
  held), ``always-retry0-undelivered`` (a RETRY 0 job is queued only if
  never delivered), ``always-acked-indexed`` (SETACK/ACKJOB: the acked set
  is exactly the acked jobs), ``always-queued-in-queue``,
  ``always-load-acked-as-aof`` (after a load, the acked jobs are those
  the file says).

The BUGGIFY knobs of ``sim/buggify.py`` stretch the narrow windows these
and the checks above need: a crash right after an ack (between its ACKJOB
and DELJOB records), YOURJOBS arriving late (crossing FASTACKs), a
rewrite every fraction of a second.

At the end of a run, in ``sim/runner.py``: ``acked-collected`` (acks, dummy
acks included, are collected everywhere), ``replicated-before-ok`` (an OK
means REPLICATE copies), ``converged`` (membership and FAIL flags agree
after heal). By the explorer, in ``sim/explore.py``: ``model-read``,
``pause-out``, ``leaving``, ``async-replicated``, ``acked-survives-restart``,
``shutdown-no-amnesia``, ``leaving-added-delivered`` (a job added on a
leaving node itself, which keeps no copy, is delivered on the others
within 3 s plus its DELAY; a RETRY 0 one exactly once).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from .workload import Event


@attrs.define
class Crashes:
    """What node crashes did to the jobs (from the World's bookkeeping).

    ``holders``: job id -> nodes that registered it (any incarnation).
    ``amnesia``: job id -> nodes that held it (ACTIVE or QUEUED, body known)
    when they crashed and did not load it back on restart (unsynced AOF
    writes, a wiped disk).
    """

    appendfsync: str = "always"
    holders: dict[str, set[str]] = attrs.field(factory=dict)
    amnesia: dict[str, set[str]] = attrs.field(factory=dict)
    # job id -> seconds a copy of it sat in the network (a fault held the
    # bytes back): Disque sends the TTL left, so that copy lives as much
    # longer.
    held_back: dict[str, float] = attrs.field(factory=dict)
    # job id -> times a node delivered it (GETJOB reply sent): a reply that
    # a fault held back reaches its client after the node sent it.
    delivered_at: dict[str, list[float]] = attrs.field(factory=dict)

    def sent_at(self, job_id: str, t0: float, t: float) -> float:
        """When the node sent the GETJOB reply a client read at ``t`` for a
        call made at ``t0``: the last delivery of ``job_id`` in between
        (``t`` when the node's side is unknown)."""
        sent = [x for x in self.delivered_at.get(job_id, ()) if t0 <= x <= t]
        return sent[-1] if sent else t


@attrs.define
class Report:
    added: int = 0
    added_ok: int = 0
    delivered: int = 0
    duplicates: int = 0
    recovered: int = 0  # delivered although the ADDJOB did not answer OK
    excused: list[str] = attrs.field(factory=list)  # losses explained by amnesia
    violations: list[str] = attrs.field(factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


def _int_option(spec: Mapping[str, object], name: str, default: int) -> int:
    """An integer ADDJOB option of an invocation's record (absent or None: ``default``)."""
    value = spec.get(name)
    if value is None:
        return default
    if not isinstance(value, int):
        raise TypeError(f"invocation option {name!r} is {value!r}, not an integer")
    return value


def check(
    history: list[Event],
    drained: bool = True,
    crashes: Crashes | None = None,
    allowance_s: float = 0.5,
) -> Report:
    """No acknowledged job lost, nothing unexpected, RETRY 0 at most once,
    nothing delivered before its DELAY or after its TTL; duplicates counted.

    * lost: a RETRY > 0 job without a TTL of its own, added OK, never
      delivered. Excused (``report.excused``) only when nodes holding it
      crashed and came back without it (amnesia: unsynced AOF, wiped disk)
      and fewer than its REPLICATE holders kept it.
    * DELAY and TTL are measured on the nodes' wall clocks, which may be
      skewed, drift and jump: ``allowance_s`` is how far they may be off.
      A copy a fault held back in the network lives that much longer
      (``Crashes.held_back``: the TTL travels as what is left of it). A
      GETJOB reply a fault held back counts from when the node sent it
      (``Crashes.delivered_at``), not from when its client read it.
    """
    report = Report()
    crashes = crashes or Crashes()
    invoked: dict[str, dict[str, object]] = {}  # body -> invoke data
    invoked_at: dict[str, float] = {}
    ok_ids: dict[str, str] = {}  # body -> job id
    ok_at: dict[str, float] = {}
    deliveries: Counter[str] = Counter()
    delivered_ids: dict[str, set[str]] = {}
    for e in history:
        if e.op == "invoke":
            invoked[e.data["body"]] = e.data
            invoked_at[e.data["body"]] = e.t
        elif e.op == "add":
            report.added += 1
            if e.data["ok"]:
                report.added_ok += 1
                ok_ids[e.data["body"]] = e.data["reply"]
                ok_at[e.data["body"]] = e.t
        elif e.op == "get":
            body = e.data["body"]
            report.delivered += 1
            deliveries[body] += 1
            delivered_ids.setdefault(body, set()).add(e.data["id"])
            spec = invoked.get(body)
            if spec is None:
                report.violations.append(
                    f"t={e.t:.3f} {e.client} got {e.data['id']} body {body!r} never added"
                )
                continue
            delay = _int_option(spec, "delay", 0)
            if delay and e.t < invoked_at[body] + delay - allowance_s:
                report.violations.append(
                    f"t={e.t:.3f} {e.data['id']} delivered {e.t - invoked_at[body]:.2f}s "
                    f"after ADDJOB, before its DELAY {delay}"
                )
            ttl = _int_option(spec, "ttl", 0)
            held = crashes.held_back.get(e.data["id"], 0.0)
            sent = crashes.sent_at(e.data["id"], float(e.data.get("t0", e.t)), e.t)
            if ttl and body in ok_at and sent > ok_at[body] + ttl + 1 + allowance_s + held:
                report.violations.append(
                    f"t={e.t:.3f} {e.data['id']} delivered {sent - ok_at[body]:.2f}s "
                    f"after ADDJOB, after its TTL {ttl}"
                )
    for body, count in sorted(deliveries.items()):
        report.duplicates += count - 1
        if body not in ok_ids:
            report.recovered += 1
        if invoked.get(body, {}).get("retry") == 0 and count > 1:
            report.violations.append(f"RETRY 0 job {body!r} delivered {count} times")
        if body in ok_ids and delivered_ids[body] != {ok_ids[body]}:
            report.violations.append(
                f"job {body!r} added as {ok_ids[body]} delivered as {sorted(delivered_ids[body])}"
            )
    for body, job_id in sorted(ok_ids.items()):
        spec = invoked[body]
        if spec["retry"] == 0 or spec.get("ttl") or body in deliveries:
            continue
        holders = crashes.holders.get(job_id, set())
        forgot = crashes.amnesia.get(job_id, set())
        kept = holders - forgot
        copies = _int_option(spec, "copies", 1)
        if forgot and len(kept) < copies:
            report.excused.append(
                f"job {job_id} ({body!r}) lost: holders {sorted(holders)}, "
                f"forgot after crash {sorted(forgot)}, REPLICATE {copies}"
            )
            continue
        report.violations.append(
            f"job {job_id} ({body!r}) added OK, never delivered (lost); "
            f"holders {sorted(holders)}, forgot after crash {sorted(forgot)}"
        )
    if not drained and not report.violations and not report.excused:
        report.violations.append("drain phase timed out")
    return report


# ------------------------------------------------- timing checks (issue #15)

Calm = Callable[[float, float], bool]  # no fault in force over [start, end]
# What a re-queue at RETRY may take beyond RETRY itself: the WILLQUEUE
# advance and the time error (0.5 s each), the timer's and the consumers'
# polling, a backlog of re-queued jobs in the drain.
REQUEUE_SLACK_S = 5.0
# A NACKed job goes back to its queue at once; a consumer polls every
# 0.2 s at most and NACKed jobs keep their place (creation time).
NACK_PROMPT_S = 1.0
# A delivery this soon after a hold began (or an ack) may have raced it.
RACE_S = 1.0


def _phase_times(history: list[Event]) -> tuple[float | None, float | None]:
    """When the drain began (everything healed) and when the consumers stopped."""
    drain = settle = None
    for e in history:
        if e.op == "phase" and e.data.get("ev") == "drain":
            drain = e.t
        elif e.op == "phase" and e.data.get("ev") == "settle":
            settle = e.t
    return drain, settle


def _consumers_off(history: list[Event]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    off: float | None = None
    for e in history:
        if e.op == "consumers-off":
            off = e.t
        elif e.op == "consumers-on" and off is not None:
            out.append((off, e.t))
            off = None
    if off is not None:
        out.append((off, float("inf")))
    return out


def _acked(e: Event) -> bool:
    """An ack the node answered (not a connection lost meanwhile)."""
    return e.op == "ack" and not str(e.data.get("reply", "")).startswith(
        ("ERR", "conn", "MISCONF")
    )


def _acked_nothing_leaving(e: Event) -> bool:
    """An ACKJOB answered 0 by a node that was leaving when it was sent or
    answered, or that knew no other member then (``noop``, a cluster of
    one): it knew no unacked copy and made no dummy ack."""
    return (
        e.op == "ack"
        and not e.data.get("fast")
        and bool(e.data.get("leaving") or e.data.get("noop"))
        and str(e.data.get("reply")) == "0"
    )


def check_requeue(
    history: list[Event], allowance_s: float, crashes: Crashes | None = None
) -> tuple[list[str], list[str]]:
    """requeue-timely: every RETRY > 0 job ADDJOB acknowledged is, after
    heal, acked, expired by its TTL, or delivered again within RETRY plus
    an allowance after its last delivery (or the heal, if later); jobs that
    consumers forgot, NACKed, handed over or vanished with included.
    Returns (violations, excused): a job every holder of which lost it in a
    crash (unsynced AOF, wiped disk) is excused, as in ``check``."""
    crashes = crashes or Crashes()
    healed, stopped = _phase_times(history)
    if healed is None or stopped is None:
        return [], []
    added: dict[str, tuple[float, dict[str, Any]]] = {}
    last_get: dict[str, float] = {}
    answered: set[str] = set()  # ack attempted (answered or not)
    # A NACK or ENQUEUE DELAY after the last delivery: not due back before
    # the delay's end (the other holders stand by that long plus RETRY).
    delayed_to: dict[str, float] = {}
    for e in history:
        if e.op == "add" and e.data["ok"] and e.data["retry"] > 0:
            added[e.data["reply"]] = (e.t, e.data)
        elif e.op == "get":
            last_get[e.data["id"]] = e.t
            delayed_to.pop(e.data["id"], None)
        elif e.op == "ack":
            answered.add(e.data["id"])
        elif _delayed(e):
            end = e.t + int(e.data["delay"])
            delayed_to[e.data["id"]] = max(end, delayed_to.get(e.data["id"], end))
    out: list[str] = []
    excused: list[str] = []
    for job_id, (ok_t, spec) in sorted(added.items()):
        got = last_get.get(job_id)
        if got is None or job_id in answered:
            # Never delivered (the loss check's business), or acked (an
            # ack may reach the holders after a later delivery).
            continue
        retry = _int_option(spec, "retry", 1)
        due = max(got, healed, delayed_to.get(job_id, 0.0)) + retry + REQUEUE_SLACK_S + allowance_s
        ttl = _int_option(spec, "ttl", 0)
        if ttl and ok_t + ttl <= due + allowance_s:
            continue  # may have expired first
        if due >= stopped:
            continue  # the consumers stopped before it was due
        forgot = crashes.amnesia.get(job_id, set())
        kept = crashes.holders.get(job_id, set()) - forgot
        if forgot and len(kept) < _int_option(spec, "copies", 1):
            excused.append(f"job {job_id} not delivered again: holders forgot {sorted(forgot)}")
            continue
        out.append(
            f"requeue-timely: {job_id} (RETRY {retry}) last delivered at t={got:.2f}, "
            f"not acked, not delivered again by t={due:.2f} (healed at t={healed:.2f})"
        )
    return out, excused


def check_nack(
    history: list[Event], calm: Calm, queued_at: Mapping[str, list[float]] | None = None
) -> list[str]:
    """nack-prompt: a NACKed job (NACK answered 1) is queued again (a node
    says so, ``queued_at``) or delivered again within ``NACK_PROMPT_S``
    while no fault is in force and consumers are on. Queued is enough: how
    soon a consumer then asks for it is the workload's business (seed 5124,
    queued 4 ms after the NACK and fetched 1 s later)."""
    _healed, stopped = _phase_times(history)
    off = _consumers_off(history)
    gets: dict[str, list[tuple[float, str]]] = {}
    for e in history:
        if e.op == "get":
            gets.setdefault(e.data["id"], []).append((e.t, e.client))
    out = []
    for e in history:
        if e.op != "nack" or e.data.get("reply") != "1" or e.data.get("delay"):
            continue  # a NACK with DELAY: nack-delay-holds and nack-delay-ends
        end = e.t + NACK_PROMPT_S
        if stopped is not None and end >= stopped:
            continue
        if any(a <= end and e.t <= b for a, b in off) or not calm(e.t, end):
            continue
        # The delivery NACKed: the consumer's last one before; the job may
        # be delivered again before the NACK's answer is read.
        got = max(
            (t for t, c in gets.get(e.data["id"], []) if c == e.client and t <= e.t), default=-1.0
        )
        t0 = float(e.data.get("t0", e.t))
        requeued = any(t0 <= t <= end for t in (queued_at or {}).get(e.data["id"], ()))
        if not requeued and not any(got < t <= end for t, _ in gets.get(e.data["id"], [])):
            again = [t for t, _ in gets.get(e.data["id"], []) if t > e.t]
            when = f"at t={again[0]:.2f}" if again else "never"
            out.append(
                f"nack-prompt: {e.data['id']} NACKed at t={e.t:.2f} on n{e.data['node']}, "
                f"delivered again {when} (bound {NACK_PROMPT_S}s)"
            )
    return out


def _delivery_times(history: list[Event]) -> dict[str, list[float]]:
    """Job id -> the times it was delivered (GETJOB), in history order."""
    gets: dict[str, list[float]] = {}
    for e in history:
        if e.op == "get":
            gets.setdefault(e.data["id"], []).append(e.t)
    return gets


def check_working(
    history: list[Event], calm: Calm, queued_at: Mapping[str, list[float]] | None = None
) -> list[str]:
    """working-holds: no job is queued again (a node says so, ``queued_at``)
    or delivered again while a consumer holds it and keeps sending WORKING
    (every RETRY/3), in a cluster without faults. The node's re-queue is the
    evidence that does not wait for another consumer to ask in time."""
    gets = _delivery_times(history)
    out = []
    for e in history:
        if e.op != "hold":
            continue
        start, retry = float(e.data["start"]), _int_option(e.data, "retry", 1)
        if not calm(start, e.t):  # calm() keeps a margin before start
            continue
        during = [t for t in gets.get(e.data["id"], []) if start + RACE_S < t < e.t]
        queued = [t for t in (queued_at or {}).get(e.data["id"], ()) if start + RACE_S < t < e.t]
        if during or queued:
            what = (
                f"delivered again at t={during[0]:.2f}"
                if during
                else f"queued again at t={queued[0]:.2f}"
            )
            out.append(
                f"working-holds: {e.data['id']} held with WORKING from t={start:.2f} "
                f"to t={e.t:.2f} (RETRY {retry}) {what}"
            )
    return out


# calm_but_crash(victim, start, end, after): calm over [start, end] but for
# crashes of node ``victim`` that began after ``after`` (World.calm_but_crash).
CalmButCrash = Callable[[int, float, float, float], bool]
# A job its consumer works on without WORKING (a long RETRY) is due back at
# the delivering node's next retry point for it (set when it was queued
# there: a delivery does not move it, as in the original), and on the other
# holders no sooner than RETRY from the delivery (Node.tell_deliveries);
# an ack sent this long before the first of those still counts (the random
# time error, 0.25 s, a network delay, margin).
WORK_SLACK_S = 1.0


def check_failover_holds(
    history: list[Event],
    calm_but_crash: CalmButCrash,
    queued_at: Mapping[str, list[float]] | None = None,
    retry_points: Mapping[str, list[tuple[float, float]]] | None = None,
) -> list[str]:
    """failover-holds: a job its consumer keeps is neither queued again (a
    node says so, ``queued_at``) nor delivered again until the consumer
    sends its ack, while the cluster is calm but for crashes of the node it
    came from that began once its other holders had been told of the
    delivery (``RACE_S`` after it: that node's next cron, or the consumer's
    first WORKING, broadcast). Two kinds:

    * ``hold``: held with WORKING every RETRY/3; when its node went down, the
      consumer sent WORKING to the other nodes in turn (``moved``) and acked
      where one answered. Holds that never moved are working-holds' business.
      The survivors knew a consumer had it: no fail-over, and their re-queue
      pushed by each WORKING;
    * ``work``: a long RETRY job worked on without WORKING, acked (on
      another node if its own went down) before its RETRY from the delivery
      ran out, and before the delivering node's next retry point for it
      (``retry_points``: delivered at, retry point; ``WORK_SLACK_S``); in a
      calm cluster too."""
    gets = _delivery_times(history)
    out = []
    for e in history:
        if e.op not in ("hold", "work") or "acked" not in e.data:
            continue
        if e.op == "hold" and "moved" not in e.data:
            continue
        start, end = float(e.data["start"]), float(e.data["acked"])
        retry = _int_option(e.data, "retry", 1)
        if e.op == "work":
            points = [p for t, p in (retry_points or {}).get(e.data["id"], ()) if t <= start]
            due = min(start + retry, points[-1] if points else start)
            if end > due - WORK_SLACK_S:
                continue  # its RETRY ran out first: a re-queue is due
        origin = int(e.data["from"])
        if not calm_but_crash(origin, start, end, start + RACE_S):
            continue
        jid = e.data["id"]
        during = [t for t in gets.get(jid, []) if start + RACE_S < t < end]
        queued = [t for t in (queued_at or {}).get(jid, ()) if start + RACE_S < t < end]
        if during or queued:
            what = (
                f"delivered again at t={during[0]:.2f}"
                if during
                else f"queued again at t={queued[0]:.2f}"
            )
            how = "held with WORKING" if e.op == "hold" else "worked on"
            moved = f", moved at t={float(e.data['moved']):.2f}" if "moved" in e.data else ""
            out.append(
                f"failover-holds: {jid} got from n{origin} at t={start:.2f}, {how} until its "
                f"ack at t={end:.2f} on n{e.data['node']} (RETRY {retry}{moved}), {what}"
            )
    return out


def check_acked(history: list[Event], calm: Calm) -> list[str]:
    """ack-final: a job acked (ACKJOB or FASTACK answered, on any node, over
    any connection, a dummy ack included) while no fault is in force is not
    delivered again. Not an ACKJOB a leaving node answered 0: a node told
    CLUSTER LEAVING yes makes no dummy ack for an ID it does not hold (SPEC
    section 4, Disque's ackjobCommand), so that ACKJOB acked nothing."""
    gets = _delivery_times(history)
    out = []
    for e in history:
        if not _acked(e) or _acked_nothing_leaving(e):
            continue
        later = [t for t in gets.get(e.data["id"], []) if t > e.t + RACE_S]
        if later and calm(e.t - RACE_S, later[0]):
            out.append(
                f"ack-final: {e.data['id']} acked at t={e.t:.2f} on n{e.data['node']} "
                f"({'FASTACK' if e.data.get('fast') else 'ACKJOB'}), "
                f"delivered again at t={later[0]:.2f}"
            )
    return out


def check_answered(history: list[Event]) -> list[str]:
    """answered: every command a client sent gets its reply. Pipelined
    ADDJOBs (the second window sent while the first waits for its copies)
    still without a reply UNANSWERED_S after every fault was healed."""
    return [
        f"answered: {e.data['count']} pipelined ADDJOB(s) to n{e.data['node']} "
        f"({', '.join(e.data['bodies'])}) still without a reply at t={e.t:.2f}, "
        "long after every fault healed"
        for e in history
        if e.op == "unanswered"
    ]


# ------------------------------------- NACK/ENQUEUE with DELAY, and WAITJOB

# A POSTPONE reaches the other holders within a network delay of the
# command's answer: a copy queued there may go out until then.
POSTPONE_RACE_S = 0.2
# WAITJOB blocked on a job's creator answers within this of an ack the
# cluster knows of (the reply of the ACKJOB/FASTACK back at its client).
WAITJOB_ACK_S = 1.0
# A job's creator expires it this long after its TTL at most (its timer
# fires a second past the expire time, a second-granular one).
WAITJOB_TTL_S = 3.0
DELAYED_OPS = ("nack", "enqueue")


def _delayed(e: Event) -> bool:
    """A NACK or ENQUEUE with a DELAY that the node took (answered 1)."""
    return e.op in DELAYED_OPS and bool(e.data.get("delay")) and e.data.get("reply") == "1"


def _commands_at(history: list[Event]) -> dict[str, list[tuple[float, float, Event]]]:
    """Job id -> (sent, answered, event) of each NACK, ENQUEUE or WORKING a
    client sent for it."""
    out: dict[str, list[tuple[float, float, Event]]] = {}
    for e in history:
        if e.op in (*DELAYED_OPS, "working"):
            out.setdefault(e.data["id"], []).append((float(e.data.get("t0", e.t)), e.t, e))
    return out


def _other_command(
    commands: Mapping[str, list[tuple[float, float, Event]]], e: Event, t0: float, until: float
) -> bool:
    """Whether another client's NACK, ENQUEUE or WORKING for e's job may
    have been applied after e's command and by ``until``: sent by then and
    not answered before e's was sent. Two commands in flight together are
    applied in either order (seed 551573: an ENQUEUE DELAY 1 sent 0.4 ms
    before another client's ENQUEUE DELAY 2 was applied after it, and the
    job came back 1 s later, not 2)."""
    return any(
        other is not e and sent <= until and answered > t0
        for sent, answered, other in commands.get(e.data["id"], ())
    )


def _paused_windows(history: list[Event]) -> list[tuple[float, float]]:
    """When a node may have had the queue paused in (the workload's PAUSE
    q in; an admin call that failed may have applied): a delayed job's
    re-queue waits there."""
    out: list[tuple[float, float]] = []
    since: float | None = None
    for e in history:
        if e.client != "admin":
            continue
        if e.op in ("pause", "error") and since is None:
            since = e.t - RACE_S
        elif e.op == "resume" and since is not None:
            out.append((since, e.t))
            since = None
    if since is not None:
        out.append((since, float("inf")))
    return out


def check_delay_holds(
    history: list[Event],
    calm: Calm,
    allowance_s: float,
    delivered_at: Mapping[str, list[float]] | None = None,
) -> list[str]:
    """nack-delay-holds: a job NACKed or ENQUEUEd with DELAY d (answered 1)
    is delivered by no node (a GETJOB reply sent, ``delivered_at``; the
    clients' reads when unknown) from a network delay after the command's
    answer until d less ``allowance_s`` after it, while no fault is in force
    and no other client's NACK, ENQUEUE or WORKING for it was in flight
    with it or sent meanwhile (a duplicate delivery's own say)."""
    sent = delivered_at if delivered_at is not None else _delivery_times(history)
    commands = _commands_at(history)
    out = []
    for e in history:
        if not _delayed(e):
            continue
        jid, delay, t0 = e.data["id"], int(e.data["delay"]), float(e.data["t0"])
        start, end = e.t + POSTPONE_RACE_S, e.t + delay - allowance_s
        early = [t for t in sent.get(jid, ()) if start < t < end]
        if not early or not calm(t0, e.t + delay):
            continue
        if _other_command(commands, e, t0, early[0]):
            continue
        out.append(
            f"nack-delay-holds: {jid} {e.op.upper()} DELAY {delay} answered at t={e.t:.2f} "
            f"on n{e.data['node']}, delivered again at t={early[0]:.2f}"
        )
    return out


def check_delay_ends(
    history: list[Event],
    calm: Calm,
    allowance_s: float,
    queued_at: Mapping[str, list[float]] | None = None,
    crashes: Crashes | None = None,
) -> list[str]:
    """nack-delay-ends: a job NACKed or ENQUEUEd with DELAY d (answered 1)
    and not acked (no client sent ACKJOB for it by then) is queued again
    (a node says so, ``queued_at``) or delivered again within d plus
    ``NACK_PROMPT_S`` and ``allowance_s``
    after the answer, while no fault is in force and consumers are on; not
    if its TTL may run out first (a delay past the TTL means expiry), a
    queue paused in holds it, another client's NACK, ENQUEUE or WORKING
    for it was in flight with it or sent meanwhile, or the node that took
    the delay forgot the job (a DEBUG FLUSHALL, ``Crashes.amnesia``: the
    others stand by longer). A delay of the job's answered before and
    still running (another consumer's, the job delivered twice) may end
    later: the job is then due by that end instead, since two holders each
    waiting for a delay queue it at the later of the two ends."""
    _healed, stopped = _phase_times(history)
    off = _consumers_off(history)
    paused = _paused_windows(history)
    commands = _commands_at(history)
    gets = _delivery_times(history)
    added: dict[str, tuple[float, int]] = {}
    acks: dict[str, list[float]] = {}
    for e in history:
        if e.op == "add" and e.data["ok"]:
            added[e.data["reply"]] = (e.t, _int_option(e.data, "ttl", 0))
        elif e.op == "ack" and "t0" in e.data:
            acks.setdefault(e.data["id"], []).append(float(e.data["t0"]))
    out = []
    for e in history:
        if not _delayed(e):
            continue
        jid, delay, t0 = e.data["id"], int(e.data["delay"]), float(e.data["t0"])
        end = e.t + delay + NACK_PROMPT_S + allowance_s
        # Seed 622230: c1's ENQUEUE DELAY 4 on n1 was answered, then c2's
        # ENQUEUE DELAY 1 on n2 (both got the job); n1 kept its later end
        # and queued the job 3.8 s after c2's answer, as documented.
        for _sent, answered, other in commands.get(jid, ()):
            if not _delayed(other):
                continue
            other_end = answered + int(other.data["delay"])
            running = answered < t0 and other_end > e.t
            if running and not any(answered < t < t0 for t in gets.get(jid, ())):
                end = max(end, other_end + NACK_PROMPT_S + allowance_s)
        ok_t, ttl = added.get(jid, (0.0, 0))
        if stopped is not None and end >= stopped:
            continue
        if ttl and ok_t + ttl <= end + allowance_s + 1:
            continue
        if any(a <= end and t0 <= b for a, b in off + paused) or not calm(t0, end):
            continue
        if any(t <= end for t in acks.get(jid, [])):
            # Acked: never queued again. An ACKJOB sent before the NACK counts
            # as well: the node that took the NACK may not have heard of it
            # yet (seed 491515: the job's second consumer acked it on n1 as
            # its first one NACKed it with DELAY 1 on n0, 11 ms apart).
            continue
        if _other_command(commands, e, t0, end):
            continue
        if f"n{e.data['node']}" in (crashes or Crashes()).amnesia.get(jid, ()):
            continue
        again = [t for t in (queued_at or {}).get(jid, ()) if t0 < t <= end]
        again += [t for t in gets.get(jid, ()) if e.t < t <= end]
        if not again:
            later = [t for t in gets.get(jid, ()) if t > end]
            when = f"at t={later[0]:.2f}" if later else "never"
            out.append(
                f"nack-delay-ends: {jid} {e.op.upper()} DELAY {delay} answered at t={e.t:.2f} "
                f"on n{e.data['node']}, not queued again by t={end:.2f}, delivered again {when}"
            )
    return out


def check_retry0_refused(history: list[Event]) -> list[str]:
    """retry0-refused: a NACK or ENQUEUE (with a DELAY or not) of a RETRY 0
    job its client got is never answered 1 (at most once: the node must not
    queue it again)."""
    return [
        f"retry0-refused: RETRY 0 job {e.data['id']} {e.op.upper()}"
        f"{' DELAY ' + str(e.data['delay']) if e.data.get('delay') else ''} "
        f"answered 1 at t={e.t:.2f} on n{e.data['node']}"
        for e in history
        if e.op in DELAYED_OPS and e.data.get("retry") == 0 and e.data.get("reply") == "1"
    ]


def _ack_done(e: Event) -> bool:
    """An ack answered by a node that acked something with it (dummy acks
    included; not a leaving or lone node's ACKJOB 0)."""
    return _acked(e) and not _acked_nothing_leaving(e) and not e.data.get("noop")


def check_waitjob(
    history: list[Event],
    calm: Calm,
    allowance_s: float,
    net_s: float,
    before_refused: frozenset[int] = frozenset(),
) -> list[str]:
    """waitjob-true: WAITJOB answers ``acked`` only for a job some client
    sent ACKJOB or FASTACK for before the answer (a lost reply still acks);
    of jobs whose ADDJOB answered OK (a job whose ADDJOB failed is gone for
    its creator, though its copies may live on and be acked elsewhere:
    seed 309453187), never ``gone`` for a job whose ack was answered before the call (calm
    from the ack to the answer, the ack well inside the job's TTL); and a
    call blocked on the node that created each of its jobs answers within
    ``WAITJOB_ACK_S`` (plus ``net_s`` of network) of the last of them being
    done, while calm: its first ack's reply back at its client, or its TTL
    run out (``WAITJOB_TTL_S`` after). A node of a release before REFUSED
    (``before_refused``, node indexes) is told DELJOB for a job whose ADDJOB
    failed, and remembers it as acked, as that release does: its ``acked``
    for a job whose ADDJOB was not answered OK is its release's answer
    (seed 773259: a NOREPL job delivered meanwhile, WAITJOB on the bus
    protocol 3 node answered acked)."""
    sent: dict[str, list[float]] = {}  # job -> ACKJOB/FASTACK send times
    done: dict[str, list[tuple[float, float]]] = {}  # job -> (sent, answered), answered acks
    added: dict[str, tuple[float, int]] = {}
    for e in history:
        if e.op == "add" and e.data["ok"]:
            added[e.data["reply"]] = (e.t, _int_option(e.data, "ttl", 0))
        elif e.op == "ack" and "t0" in e.data:
            sent.setdefault(e.data["id"], []).append(float(e.data["t0"]))
            if _ack_done(e):
                done.setdefault(e.data["id"], []).append((float(e.data["t0"]), e.t))
    out = []
    for e in history:
        if e.op != "waitjob" or not isinstance(e.data.get("reply"), list):
            continue
        start, ids, replies = float(e.data["t0"]), e.data["ids"], e.data["reply"]
        where = f"WAITJOB on n{e.data['node']} from t={start:.2f} to t={e.t:.2f}"
        for jid, value in zip(ids, replies, strict=True):
            if value == "acked" and not any(t < e.t for t in sent.get(jid, ())):
                if jid not in added and e.data["node"] in before_refused:
                    continue
                out.append(f"waitjob-true: {jid} answered acked ({where}), no client acked it")
            if value != "gone":
                continue
            ok_t, ttl = added.get(jid, (0.0, 0))
            if jid not in added:
                continue  # ADDJOB not answered OK: its creator may say gone
            before = [
                (t0, t)
                for t0, t in done.get(jid, ())
                if t + RACE_S < start and not (ttl and t > ok_t + ttl - allowance_s - 1)
            ]
            if before and calm(before[0][0], e.t):
                out.append(
                    f"waitjob-true: {jid} answered gone ({where}), acked at t={before[0][1]:.2f}"
                )
        if not all(e.data.get("creator", ())):
            continue
        # When each job was done for its creator: its first ack's reply, or
        # its TTL's end (expired there, a timer's second and a sample late).
        ends: dict[str, tuple[float, float]] = {}  # job -> (done at, since)
        for jid in ids:
            ok_t, ttl = added.get(jid, (0.0, 0))
            known = [(t, t0) for t0, t in done.get(jid, ())]
            if ttl and jid in added:
                known.append((ok_t + ttl + WAITJOB_TTL_S, ok_t))
            if known:
                ends[jid] = min(known)
        if len(ends) < len(ids) or not all(jid in added for jid in ids):
            continue
        first = min(since for _, since in ends.values())
        last = max(at for at, _ in ends.values())
        due = max(last, start) + WAITJOB_ACK_S + net_s
        timeout = int(e.data.get("timeout") or 0)
        if timeout and start + timeout / 1000 <= due:
            continue  # its timeout came first
        if e.t > due and calm(first, due):
            out.append(
                f"waitjob-true: {where} answered {replies}, the last of {ids} was acked or "
                f"expired by t={last:.2f} (bound {WAITJOB_ACK_S}s on the creator)"
            )
    return out
