"""Black-box checks over a workload history (Jepsen's total-queue, adapted
to Disque's guarantees), plus the end-of-run liveness checks."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

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
            if ttl and body in ok_at and e.t > ok_at[body] + ttl + 1 + allowance_s:
                report.violations.append(
                    f"t={e.t:.3f} {e.data['id']} delivered {e.t - ok_at[body]:.2f}s "
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
