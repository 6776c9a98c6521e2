"""Checks over a workload history."""

from __future__ import annotations

from collections import Counter

import attrs

from .workload import Event


@attrs.define
class Report:
    added: int = 0
    added_ok: int = 0
    delivered: int = 0
    duplicates: int = 0
    violations: list[str] = attrs.field(factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


def check(history: list[Event], drained: bool = True) -> Report:
    """No acknowledged ADDJOB lost, nothing delivered that was never added,
    RETRY 0 jobs delivered at most once; duplicates counted."""
    report = Report()
    attempted: dict[str, int] = {}  # body -> retry
    ok_ids: dict[str, str] = {}  # body -> job id
    deliveries: Counter[str] = Counter()
    delivered_ids: dict[str, set[str]] = {}
    for e in history:
        if e.op == "invoke":
            attempted[e.data["body"]] = e.data["retry"]
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
            report.violations.append(f"job {job_id} ({body!r}) added OK, never delivered (lost)")
    if not drained and not report.violations:
        report.violations.append("drain phase timed out")
    return report
