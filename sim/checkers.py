"""Checks over a workload history."""

from __future__ import annotations

from collections import Counter

import attrs

from .workload import Event


@attrs.define
class Crashes:
    """What node crashes did to the jobs (from the World's bookkeeping).

    ``holders``: job id -> nodes that registered it (any incarnation).
    ``amnesia``: job id -> nodes that held it (ACTIVE or QUEUED, body known)
    when they crashed and did not load it back from their AOF on restart.
    """

    appendfsync: str = "always"
    holders: dict[str, set[str]] = attrs.field(factory=dict)
    amnesia: dict[str, set[str]] = attrs.field(factory=dict)


@attrs.define
class Report:
    added: int = 0
    added_ok: int = 0
    delivered: int = 0
    duplicates: int = 0
    excused: list[str] = attrs.field(factory=list)  # losses explained by crashes
    violations: list[str] = attrs.field(factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


def check(history: list[Event], drained: bool = True, crashes: Crashes | None = None) -> Report:
    """No acknowledged ADDJOB lost, nothing delivered that was never added,
    RETRY 0 jobs delivered at most once; duplicates counted.

    The one relaxation for crashes: with ``appendfsync everysec`` a RETRY > 0
    job added OK may be lost only if fewer than its REPLICATE holders kept
    it, a holder that crashed and came back without it (amnesia: its copy
    was not yet fsynced) not counting as keeping it. Such a loss goes to
    ``report.excused``. With ``appendfsync always`` nothing is excused: a
    lost job is a violation whatever crashed.
    """
    report = Report()
    crashes = crashes or Crashes()
    copies: dict[str, int] = {}  # body -> REPLICATE asked
    attempted: dict[str, int] = {}  # body -> retry
    ok_ids: dict[str, str] = {}  # body -> job id
    deliveries: Counter[str] = Counter()
    delivered_ids: dict[str, set[str]] = {}
    for e in history:
        if e.op == "invoke":
            attempted[e.data["body"]] = e.data["retry"]
            copies[e.data["body"]] = e.data.get("copies", 1)
        elif e.op == "add":
            report.added += 1
            if e.data["ok"]:
                report.added_ok += 1
                ok_ids[e.data["body"]] = e.data["reply"]
        elif e.op == "get":
            body = e.data["body"]
            report.delivered += 1
            deliveries[body] += 1
            delivered_ids.setdefault(body, set()).add(e.data["id"])
            if body not in attempted:
                report.violations.append(
                    f"t={e.t:.3f} {e.client} got {e.data['id']} body {body!r} never added"
                )
    for body, count in sorted(deliveries.items()):
        report.duplicates += count - 1
        if attempted.get(body) == 0 and count > 1:
            report.violations.append(f"RETRY 0 job {body!r} delivered {count} times")
        if body in ok_ids and delivered_ids[body] != {ok_ids[body]}:
            report.violations.append(
                f"job {body!r} added as {ok_ids[body]} delivered as {sorted(delivered_ids[body])}"
            )
    for body, job_id in sorted(ok_ids.items()):
        if attempted[body] > 0 and body not in deliveries:
            holders = crashes.holders.get(job_id, set())
            forgot = crashes.amnesia.get(job_id, set())
            kept = holders - forgot
            if crashes.appendfsync != "always" and forgot and len(kept) < copies[body]:
                report.excused.append(
                    f"job {job_id} ({body!r}) lost: holders {sorted(holders)}, "
                    f"forgot after crash {sorted(forgot)}, REPLICATE {copies[body]}"
                )
                continue
            report.violations.append(
                f"job {job_id} ({body!r}) added OK, never delivered (lost); "
                f"holders {sorted(holders)}, forgot after crash {sorted(forgot)}"
            )
    if not drained and not report.violations and not report.excused:
        report.violations.append("drain phase timed out")
    return report
