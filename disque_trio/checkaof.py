"""``disque-trio check-aof [--fix [--yes]] FILE``: check an AOF, repair it.

Without ``--fix`` it reads the file record by record and reports: the valid
records, every damaged span (byte range, size, why), and what the records in
those spans were (which jobs lose their LOADJOB, which acknowledgements or
deletions are lost, and what that means after a restart). Exit 0 when the
file is valid, 1 otherwise.

With ``--fix`` it reports the same, then, after a confirmation (a y/N
question on a terminal; ``--yes`` without one), keeps a copy of the original
(``FILE.bak``, or ``FILE.bak.N`` when that exists) and replaces the file
atomically with every valid record, before and after the damage, in order.
A file that does not start like an AOF is never changed.
"""

from __future__ import annotations

import collections
import os
import stat
import sys

from .protocol import aof

USAGE = "Usage: disque-trio check-aof [--fix [--yes]] FILE"
MAX_LISTED = 20  # lost records listed one by one; the rest are counted


def main(args: list[str]) -> int:
    flags = {a for a in args if a.startswith("-")}
    paths = [a for a in args if not a.startswith("-")]
    unknown = flags - {"--fix", "--yes", "-y"}
    if len(paths) != 1 or unknown:
        print(USAGE, file=sys.stderr)
        return 2
    fix = "--fix" in flags
    yes = bool(flags & {"--yes", "-y"})
    path = paths[0]
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        print(f"Cannot read {path}: {e.strerror or e}", file=sys.stderr)
        return 1
    if not aof.looks_like_aof(data):
        print(not_an_aof(path, data))
        if fix:
            print("Nothing was changed.")
        return 1
    analysis = aof.analyze(data)
    for line in report(data, analysis):
        print(line)
    if analysis.valid:
        print("AOF is valid")
        return 0
    if not fix:
        print("AOF is not valid. Use the --fix option to repair it (it keeps a backup).")
        return 1
    backup = backup_path(path)
    if not yes:
        if not sys.stdin.isatty():
            print(
                f"Refusing to change {path} without confirmation: stdin is not a terminal "
                "(add --yes to repair it)",
                file=sys.stderr,
            )
            return 1
        try:
            answer = input(
                f"Repair {path} (the original is kept as {backup}; "
                "no node must be using it)? [y/N] "
            )
        except (EOFError, KeyboardInterrupt):
            answer = ""
            print()
        if answer.strip().lower() not in ("y", "yes"):
            print("Nothing was changed.")
            return 1
    try:
        with open(path, "rb") as f:
            if f.read() != data:
                print(
                    f"{path} changed while it was being checked (is a node using it?): "
                    "nothing was changed.",
                    file=sys.stderr,
                )
                return 1
        backup = write_backup(path, data)
        repaired = analysis.repaired(data)
        replace_atomically(path, repaired)
    except OSError as e:
        print(f"Could not repair {path}: {e.strerror or e}", file=sys.stderr)
        return 1
    print(f"Original kept as {backup}")
    print(
        f"Repaired {path}: {len(analysis.records)} records kept ({len(repaired)} bytes), "
        f"{len(data) - len(repaired)} bytes dropped"
    )
    return 0


def not_an_aof(path: str, data: bytes) -> str:
    """Why a file is left alone, and what to do if it is an AOF after all."""
    line = (
        f"{path} is not an AOF: it does not start with a LOADJOB, ACKJOB or DELJOB "
        f"record (it starts with {data[:24]!r})."
    )
    first = aof.resync(data, 0)
    if first is not None:
        count = len(aof.analyze(data[first:]).records)
        line += (
            f" {count} valid records follow from byte {first} on: if this is an AOF whose "
            f"beginning was destroyed, remove its first {first} bytes yourself "
            f"(keeping a copy) and check it again."
        )
    return line


def report(data: bytes, analysis: aof.Analysis) -> list[str]:
    """The analysis in words: sizes, valid records, damaged spans, and the
    jobs affected by dropping them."""
    size, good = analysis.size, analysis.ok_up_to
    kinds = collections.Counter(kind.decode() for _, _, (kind, _) in analysis.records)
    lines = [
        f"AOF analyzed: size={size}, ok_up_to={good}, diff={size - good}",
        f"Valid records: {len(analysis.records)}" + _counts(kinds),
    ]
    if analysis.valid:
        return lines
    for span in analysis.damaged:
        lines.append(f"Damaged: {_range(span)}: {span.reason}")
    if analysis.torn is not None:
        lines.append(f"Torn: {_range(analysis.torn)}: {analysis.torn.reason}")
    dropped = analysis.dropped
    kept = sum(end - start for start, end, _ in analysis.records)
    lost = [rec for span in dropped for rec in aof.lost_records(data, span)]
    lines.append(
        f"A repair keeps all {len(analysis.records)} valid records ({kept} bytes) and drops "
        f"{sum(s.size for s in dropped)} bytes in {len(dropped)} "
        f"span{'s' if len(dropped) != 1 else ''}, which held (parts of) {len(lost)} "
        f"record{'s' if len(lost) != 1 else ''}:"
    )
    effects = _Effects(analysis)
    for i, rec in enumerate(lost):
        effect = effects.of(rec)
        if i < MAX_LISTED:
            name = rec.kind.decode() if rec.kind else "a record"
            lines.append(f"  {name} of {rec.job_id or 'an unreadable job ID'}: {effect}")
    if len(lost) > MAX_LISTED:
        lines.append(f"  ... and {len(lost) - MAX_LISTED} more")
    lines.append("Jobs affected: " + effects.summary())
    return lines


class _Effects:
    """What losing a record means, given the records that are kept."""

    LOST = "this job is lost on this node (other nodes may still hold a copy)"
    UNACKED = (
        "the acknowledgement is lost: after a restart the job comes back as not "
        "acknowledged and may be delivered again"
    )
    UNDELETED = "the deletion is lost: after a restart the deleted job comes back"
    NONE = "no effect"

    def __init__(self, analysis: aof.Analysis) -> None:
        self.kept: dict[bytes, set[str]] = collections.defaultdict(set)
        for _, _, (kind, payload) in analysis.records:
            job_id = payload.id if isinstance(payload, aof.JobRecord) else payload
            self.kept[kind].add(job_id)
        # Job IDs by effect (an ID counts once: a job whose ACKJOB and DELJOB
        # are both lost is one acknowledged job that comes back).
        self.lost: set[str] = set()
        self.unacked: set[str] = set()
        self.undeleted: set[str] = set()
        self.lost_unreadable = 0  # LOADJOBs whose job ID cannot be read
        self.unknown = 0

    def of(self, rec: aof.LostRecord) -> str:
        job, kept = rec.job_id, self.kept
        if job is None:
            if rec.kind == aof.LOADJOB:
                self.lost_unreadable += 1
                return "a job is lost on this node (its ID cannot be read)"
            self.unknown += 1
            if rec.kind is None:
                return "unknown (the record cannot be read)"
            return (
                f"unknown: the job's ID cannot be read; that job comes back after a restart "
                f"if nothing else {'acknowledges' if rec.kind == aof.ACKJOB else 'deletes'} it"
            )
        gone = job in kept[aof.ACKJOB] or job in kept[aof.DELJOB]
        if rec.kind == aof.LOADJOB:
            if job in kept[aof.DELJOB]:
                return f"{self.NONE}: a DELJOB of this job is kept"
            if job in kept[aof.ACKJOB]:
                return f"{self.NONE} that matters: the job was acknowledged (its ACKJOB is kept)"
            if job in kept[aof.LOADJOB]:
                return "another LOADJOB of this job is kept: the job survives in that state"
            self.lost.add(job)
            return self.LOST
        if gone:
            return f"{self.NONE}: another ACKJOB or DELJOB of this job is kept"
        if job not in kept[aof.LOADJOB]:
            if rec.kind == aof.ACKJOB:
                # An ACKJOB alone is a dummy ack (a job acknowledged here
                # that this node never held), or the ack of a job whose
                # LOADJOB is lost too.
                return (
                    f"{self.NONE} on this node's jobs (no kept record loads this job); "
                    "if it was a dummy ack, this node forgets that ack"
                )
            return f"{self.NONE}: no kept record loads this job"
        if rec.kind == aof.ACKJOB:
            self.unacked.add(job)
            return self.UNACKED
        if rec.kind == aof.DELJOB:
            self.undeleted.add(job)
            return self.UNDELETED
        self.unknown += 1
        return (
            "unknown (the record's kind cannot be read): if it was an ACKJOB or a DELJOB, "
            "this job comes back after a restart"
        )

    def summary(self) -> str:
        parts = [
            _plural(len(self.lost) + self.lost_unreadable, "job", "lost"),
            _plural(len(self.unacked), "acknowledged job", "come{s} back not acknowledged"),
            _plural(len(self.undeleted - self.unacked), "deleted job", "come{s} back"),
        ]
        if self.unknown:
            parts.append(_plural(self.unknown, "unreadable record", "of unknown effect"))
        return ", ".join(parts)


def _plural(n: int, noun: str, rest: str) -> str:
    """'1 job comes back', '2 jobs come back'."""
    return f"{n} {noun}{'' if n == 1 else 's'} " + rest.format(s="s" if n == 1 else "")


def _counts(kinds: collections.Counter[str]) -> str:
    if not kinds:
        return ""
    return " (" + ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items())) + ")"


def _range(span: aof.Span) -> str:
    return f"bytes {span.start}-{span.end - 1} ({span.size} byte{'s' if span.size != 1 else ''})"


def backup_path(path: str) -> str:
    """FILE.bak, or FILE.bak.N for the first N that does not exist."""
    candidate = f"{path}.bak"
    n = 0
    while os.path.lexists(candidate):
        n += 1
        candidate = f"{path}.bak.{n}"
    return candidate


def write_backup(path: str, data: bytes) -> str:
    """A durable copy of the original next to it; its name."""
    while True:
        backup = backup_path(path)
        try:
            # "x": never overwrite, should another check-aof race this one.
            with open(backup, "xb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except FileExistsError:
            continue
        _copy_mode(path, backup)
        return backup


def replace_atomically(path: str, data: bytes) -> None:
    """Write a temporary file next to the target, fsync it, rename it over
    the target and fsync the directory: a crash leaves old or new, whole."""
    target = os.path.realpath(path)
    directory = os.path.dirname(target)
    tmp = os.path.join(directory, f".{os.path.basename(target)}.check-aof-{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        _copy_mode(target, tmp)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy_mode(source: str, dest: str) -> None:
    os.chmod(dest, stat.S_IMODE(os.stat(source).st_mode))
