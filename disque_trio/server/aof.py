"""The append-only file: the writer task, load, rewrite.

The core records what must survive a crash as ``Persist`` effects (a job
created, acknowledged, deleted). At the commit point the shell hands them to
:meth:`AppendOnlyFile.append`, which returns a sequence number; the writer
task (:meth:`AppendOnlyFile.run`, the one owner of the file) writes
everything appended since its last round in one call and, with ``appendfsync
always``, fsyncs once for all of it: group commit. A client's replies, and
bus messages that acknowledge a copy (GOTJOB...), wait until
:meth:`written` says their sequence number is on disk, so nothing is
acknowledged that ``kill -9`` could lose (or, with ``always``, a power
loss). With ``everysec`` the writer fsyncs once a second when the cron asks;
with ``no`` the kernel decides.

A rewrite snapshots every job into a fresh file in steps (yielding to other
tasks between chunks), keeps the records written meanwhile in a buffer,
appends them after the snapshot and swaps the file atomically.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Protocol

import trio
import trio.lowlevel

from ..config import Config
from ..core.job import Job, JobState
from ..core.node import Node
from ..core.records import aof_record, pending_by_job, replay
from ..env import Disk, Env
from ..protocol import aof as records
from ..protocol.replies import ReplyError


class AofHost(Protocol):
    """What the AOF needs of the node: its settings, seams and core."""

    config: Config
    env: Env
    node: Node

    def held_sent(self) -> None:
        """The actions held for a write ran (if any): send what they queued."""
        ...


log = logging.getLogger("disque_trio.aof")

RESTART_MARKER_SUFFIX = ".enqueue-once"
_RESTART_MARKER_TEXT = (
    b"# Written by SHUTDOWN REWRITE-AOF with aof-enqueue-jobs-once yes: the next\n"
    b"# start loads the AOF beside this file, puts the jobs that were queued back\n"
    b"# in their queues, then deletes this file.\n"
)
REWRITE_CHUNK = 1000  # jobs serialised between two yields of a rewrite


class AofLoadError(Exception):
    """The AOF cannot be loaded; the message says what to do."""


class AppendOnlyFile:
    def __init__(self, server: AofHost) -> None:
        self.server = server
        self.state = "off"  # off | on | wait-rewrite (turning on)
        self.current_size = 0
        self.base_size = 0  # size after the last rewrite, for auto-rewrite
        self.rewriting = False
        self.rewrite_buffer: list[bytes] | None = None
        self.last_rewrite_ok = True
        self.last_rewrite_seconds = -1
        self.last_write_error: str | None = None
        self.write_failures = 0
        self.loading = False
        self._since_fsync = 0
        self._turn_on_id = 0  # which turn_on() call is the current one
        # The writer's state. Each append() is one sequence number; written
        # is the last one on disk. The buffer holds what was appended since
        # the writer's last round; unwritten, what it took and could not
        # write yet (a full disk), retried once a second.
        self._buffer: list[bytes] = []
        self._unwritten = bytearray()
        self._appended = 0
        self._written = 0
        self._retry_due = False
        self._fsync_wanted = False  # the cron (everysec) or a write (always) asked
        # An fsync failed: what the file took since the last good one may
        # never reach the disk, whatever a later fsync answers (Linux marks
        # the pages clean and reports the error once). Only a rewrite from
        # memory (a new file, fsynced, renamed over) ends the failure then.
        self._fsync_lost = False
        self.flushes = 0  # DEBUG FLUSHALLs so far (a running rewrite drops their jobs)
        self._wakeup = trio.Event()
        self._progress = trio.Event()
        # Bus messages held until their records are written: (seq, send).
        self._held: deque[tuple[int, Callable[[], None]]] = deque()

    @property
    def path(self) -> str:
        return self.server.config.appendfilename

    @property
    def disk(self) -> Disk:
        return self.server.env.disk

    # -------------------------------------------------------------- writing

    def append(self, data: list[bytes]) -> int:
        """Records of one commit, for the writer; returns their sequence
        number (see :meth:`written`)."""
        self._buffer.extend(data)
        self._appended += 1
        self._wakeup.set()
        return self._appended

    @property
    def pending(self) -> int:
        """The newest sequence number not written yet, or 0."""
        return self._appended if self._appended > self._written else 0

    async def written(self, seq: int) -> bool:
        """Wait until the records of ``seq`` are written (and, with
        ``always``, fsynced); a write that fails is retried, and this waits
        on. True: the caller may reply."""
        while self._written < seq:
            await self._progress.wait()
        return True

    def after_written(self, seq: int, action: Callable[[], None]) -> None:
        """Run ``action`` once ``seq`` is written: a bus message
        acknowledging a copy (or a REPLJOB for a job whose record failed)
        must not leave before it."""
        self._held.append((seq, action))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The writer task: one write (and fsync, if due) per round for
        everything appended since the last one."""
        task_status.started()
        while True:
            await self._wakeup.wait()
            self._wakeup = trio.Event()
            if self._fsync_lost and self._retry_due and self.state == "on":
                self._retry_due = False
                self._take()
                await self.rewrite()
                continue
            self.write_now()

    def write_now(self, force: bool = False) -> None:
        """One round of the writer. While writes fail (a full disk), only
        the cron's retry once a second (``every_second``) or ``force``
        (shutdown) tries again: every append would otherwise hit the disk
        in vain."""
        upto = self._appended
        self._take()
        if self.last_write_error is not None and not (self._retry_due or force):
            return
        if self._fsync_lost:
            # A plain retry would trust an fsync that cannot vouch for the
            # bytes before it: the writer task rewrites the file instead,
            # and a shutdown writes it whole, now.
            if force and self.state == "on":
                self._rewrite_now(upto)
            return
        self._retry_due = False
        if not self._write_unwritten():
            return
        if self._fsync_wanted:
            self._fsync_wanted = False
            if not self._fsync():
                self._fsync_wanted = True
                return
        if self.last_write_error is not None:
            log.warning(
                "AOF write error looks solved: the AOF file %s is written again", self.path
            )
            self.last_write_error = None
        self._done_upto(upto)

    def _take(self) -> None:
        """Move what was appended into the bytes the file still needs (and
        the rewrite buffer, once: a retry does not add them again)."""
        if not self._buffer:
            return
        data = b"".join(self._buffer)
        self._buffer.clear()
        if self.rewrite_buffer is not None:
            self.rewrite_buffer.append(data)
        if self.state == "on":
            self._unwritten += data

    def _write_unwritten(self) -> bool:
        """Append what the file still needs. A failed append leaves nothing
        in the file (FileDisk truncates a partial one) and keeps the bytes
        for the next try: the commands they record stay applied in memory,
        their replies wait for them (nothing half-applied, nothing
        acknowledged that is not on disk)."""
        if not self._unwritten:
            return True
        data = bytes(self._unwritten)
        try:
            self.disk.append(self.path, data)
        except OSError as e:
            self._write_failed(e)
            return False
        self._unwritten.clear()
        self.current_size += len(data)
        if self.server.config.appendfsync == "always":
            self._fsync_wanted = True
        else:
            self._since_fsync += len(data)
        return True

    def _done_upto(self, seq: int) -> None:
        """The records of every sequence number up to ``seq`` are written:
        release their held actions and the replies waiting for them."""
        self._written = max(self._written, seq)
        while self._held and self._held[0][0] <= self._written:
            _, action = self._held.popleft()
            action()
        self.server.held_sent()
        self._progress.set()
        self._progress = trio.Event()

    def _fsync(self) -> bool:
        try:
            self.disk.fsync(self.path)
        except OSError as e:
            if not self._fsync_lost:
                log.warning(
                    "fsync of the AOF file %s failed: what was written since the last "
                    "fsync may be lost; the file will be rewritten from memory",
                    self.path,
                )
            self._fsync_lost = True
            self._write_failed(e)
            return False
        self._since_fsync = 0
        return True

    def _rewrite_now(self, upto: int) -> None:
        """At shutdown, after a failed fsync: the whole file from memory,
        written and fsynced as a new file renamed over the old one."""
        data = self._snapshot()
        try:
            self.disk.replace(self.path, data)
        except OSError as e:
            self._write_failed(e)
            return
        self._rewritten(upto, len(data))

    def _snapshot(self) -> bytes:
        """Every job's record as memory has it, in one go (the shutdown
        paths; a background rewrite yields between chunks)."""
        node = self.server.node
        pending = pending_by_job(node)
        return b"".join(
            record for j in node.jobs.values() if (record := aof_record(j, pending.get(j.id, ())))
        )

    def _write_failed(self, e: OSError) -> None:
        self.write_failures += 1
        if self.last_write_error is None:
            log.warning(
                "Error writing to the AOF file %s: %s. Write commands are refused "
                "(MISCONF) until a retry, once a second, succeeds",
                self.path,
                e.strerror or e,
            )
        self.last_write_error = e.strerror or str(e)

    @property
    def failing(self) -> bool:
        return self.last_write_error is not None and self.state != "off"

    def misconf(self) -> ReplyError | None:
        """The refusal for write commands while the AOF cannot be written."""
        if not self.failing:
            return None
        return ReplyError("MISCONF", f"Errors writing to the AOF file: {self.last_write_error}")

    def every_second(self) -> None:
        """The cron, once a second: retry a failed write, and under
        everysec have the writer fsync."""
        if self.state != "on":
            return
        if self.last_write_error is not None:
            self._retry_due = True
            self._wakeup.set()
        elif self.server.config.appendfsync == "everysec" and self._since_fsync:
            self._fsync_wanted = True
            self._wakeup.set()

    # -------------------------------------------------------------- loading

    def load(self, enqueue_once: bool = False) -> int:
        """At start-up: rebuild the jobs, and with ``enqueue_once`` put the
        ones recorded as queued back in their queues. Returns jobs loaded."""
        data = self.disk.read(self.path)
        if data is None:
            self.state = "on"
            return 0
        good, damage = records.scan(data)
        if damage is not None:
            raise AofLoadError(
                f"Bad file format reading the append only file {self.path}: {damage}. "
                f"Run 'disque-trio check-aof --fix {self.path}': it tells what it would "
                "drop, keeps every valid record and a backup of the file"
            )
        if good < len(data):
            if not self.server.config.aof_load_truncated:
                raise AofLoadError(
                    f"Unexpected end of file reading the append only file {self.path} "
                    f"at byte offset {good}. Use 'disque-trio check-aof --fix {self.path}' "
                    "or set aof-load-truncated yes"
                )
            log.warning(
                "!!! Warning: short read while loading the AOF file %s: the last %d "
                "bytes are a torn record and are cut off (AOF loaded up to offset %d)",
                self.path,
                len(data) - good,
                good,
            )
            data = data[:good]
            try:
                self.disk.replace(self.path, data)
            except OSError as e:
                # Appends after the torn record would be lost behind it: the
                # file is rewritten whole from memory once the disk works,
                # and write commands wait (MISCONF) until then.
                log.warning(
                    "Could not cut the torn record off the AOF file %s (%s): it will be "
                    "rewritten from memory once the disk works",
                    self.path,
                    e.strerror or e,
                )
                self._fsync_lost = True
                self._write_failed(e)
        count = self._replay(data, enqueue_once)
        self.current_size = self.base_size = len(data)
        self.state = "on"
        return count

    def load_summary(self) -> str:
        """The log line after a load: how many jobs, and when the active
        ones go back to their queues. A reloaded job comes back ``active``,
        not queued: its queue stays empty until its RETRY comes, which
        looks like data loss unless the log says so."""
        node = self.server.node
        now = node.now_ms()
        requeue_at: list[int] = []
        retry0 = queued = acked = 0
        for job in node.jobs.values():
            if job.state == JobState.QUEUED:
                queued += 1
            elif job.state == JobState.ACKED:
                acked += 1
            elif job.qtime:
                requeue_at.append(job.qtime)
            else:
                retry0 += 1
        total = len(node.jobs)
        head = f"{total} {'job' if total == 1 else 'jobs'} loaded from the AOF"
        parts: list[str] = []
        if requeue_at:
            first, last = (
                _seconds_until(min(requeue_at), now),
                _seconds_until(max(requeue_at), now),
            )
            label = "active" if len(requeue_at) == total else f"{len(requeue_at)} active"
            if len(requeue_at) == 1:
                parts.append(f"{label}: queued again by its RETRY in {first} s")
            else:
                parts.append(
                    f"{label}: queued again by their RETRY, the first in {first} s, "
                    f"the last in {last} s"
                )
        if retry0:
            parts.append(f"{retry0} active with RETRY 0: not queued again (at most once)")
        if queued:
            parts.append(f"{queued} queued")
        if acked:
            parts.append(f"{acked} acked, waiting to be collected")
        return f"{head} ({'; '.join(parts)})" if parts else head

    def _replay(self, data: bytes, enqueue_once: bool) -> int:
        entries = (record for _, _, record in records.records(data))
        return replay(self.server.node, entries, enqueue_once)

    # ------------------------------------------------------------ rewriting

    def claim_rewrite(self) -> bool:
        """Mark a rewrite as in progress now, before its task runs (INFO
        and a second BGREWRITEAOF see it at once); False if one is."""
        if self.rewriting:
            return False
        self.rewriting = True
        self.rewrite_buffer = []
        return True

    async def rewrite(self, claimed: bool = False) -> bool:
        """Compact the file from memory without stopping the node.
        ``claimed``: the caller did ``claim_rewrite()`` already."""
        if not claimed and not self.claim_rewrite():
            return False
        started = trio.current_time()
        node = self.server.node
        try:
            snapshot = list(node.jobs.values())
            pending = pending_by_job(node)
            flushes = self.flushes
            parts: list[tuple[Job, bytes]] = []
            for i in range(0, len(snapshot), REWRITE_CHUNK):
                for job in snapshot[i : i + REWRITE_CHUNK]:
                    if node.jobs.get(job.id) is job and (
                        record := aof_record(job, pending.get(job.id, ()))
                    ):
                        parts.append((job, record))
                await trio.lowlevel.checkpoint()
            if self.flushes != flushes:
                # DEBUG FLUSHALL ran meanwhile: it writes no record, so the
                # jobs it dropped must leave the snapshot here (they came
                # back in the file, and at the next start: simulator seed
                # 711027, a slow fsync stretching a rewrite).
                parts = [(job, record) for job, record in parts if node.jobs.get(job.id) is job]
            self.write_now()  # records appended until now go in the buffer
            upto = self._appended
            data = b"".join(record for _, record in parts) + b"".join(self.rewrite_buffer or ())
            self.disk.replace(self.path, data)
            self.disk.fsync(self.path)
        except OSError as e:
            log.warning("Background AOF rewrite failed: %s", e)
            self.last_rewrite_ok = False
            return False
        finally:
            self.rewrite_buffer = None
            self.rewriting = False
        self.last_rewrite_ok = True
        self.last_rewrite_seconds = int(trio.current_time() - started)
        self._rewritten(upto, len(data))
        log.info("Background AOF rewrite finished successfully (%d bytes)", len(data))
        return True

    def _rewritten(self, upto: int, size: int) -> None:
        """A new file holds every job as memory has it, and every record
        appended up to ``upto``: what a failed write kept back is in it too,
        and an fsync that failed before no longer matters."""
        self.current_size = self.base_size = size
        self._fsync_lost = False
        if self.state == "on" and (self._unwritten or self.last_write_error is not None):
            self._unwritten.clear()
            self._fsync_wanted = False
            self._since_fsync = 0
            if self.last_write_error is not None:
                log.warning("AOF write error solved by the rewrite of %s", self.path)
                self.last_write_error = None
            self._done_upto(upto)

    def rewrite_due(self) -> bool:
        config = self.server.config
        pct = config.auto_aof_rewrite_percentage
        if self.state != "on" or self.rewriting or not pct:
            return False
        if self.current_size < config.auto_aof_rewrite_min_size:
            return False
        base = self.base_size or 1
        return (self.current_size - base) * 100 // base >= pct

    async def turn_on(self) -> None:
        """CONFIG SET appendonly yes: write a fresh file from memory first."""
        # Spawned by CONFIG SET: by the time this runs, appendonly may be no again.
        if self.state != "off" or not self.server.config.appendonly:
            return
        self.state = "wait-rewrite"
        self.server.node.persisting = True
        self._turn_on_id += 1
        mine = self._turn_on_id

        def still_wanted() -> bool:
            return self._turn_on_id == mine and self.state == "wait-rewrite"

        # A rewrite already running (BGREWRITEAOF) made rewrite() return
        # False at once: the AOF stayed off while appendonly said yes.
        while self.rewriting:
            await trio.sleep(0.01)
            if not still_wanted():
                return
        ok = await self.rewrite()
        # CONFIG SET appendonly no (and maybe yes again) while the file was
        # written: setting "on" here left INFO saying on with nothing written
        # (nothing was persisted), and every later turn_on returned at once.
        if not still_wanted():
            return
        if ok:
            self.state = "on"
        else:
            self.state = "off"
            self.server.node.persisting = False

    def flushed(self) -> None:
        """DEBUG FLUSHALL: the jobs are gone, so is the file's content
        (otherwise they would come back at the next start)."""
        self._buffer.clear()
        self._unwritten.clear()
        self.flushes += 1
        if self.rewrite_buffer is not None:
            self.rewrite_buffer.clear()  # what a running rewrite gathered
        if self.state == "on":
            try:
                self.disk.replace(self.path, b"")
            except OSError as e:
                # The file still holds the jobs: the retry that works writes
                # it again from memory (as after a failed fsync), not the
                # records after it alone.
                self._write_failed(e)
                self._fsync_lost = True
                return
            self.current_size = self.base_size = 0

    def turn_off(self) -> None:
        """CONFIG SET appendonly no: what could not be written is dropped
        (no AOF, no durability to wait for), and its waiters released."""
        self.state = "off"
        self.server.node.persisting = False
        self.disk.close(self.path)
        self._unwritten.clear()
        self._buffer.clear()
        self._fsync_wanted = False
        self._fsync_lost = False
        if self.last_write_error is not None:
            log.warning("AOF turned off while its writes failed: what was not written is dropped")
            self.last_write_error = None
        self._done_upto(self._appended)

    def shutdown_rewrite(self) -> None:
        """SHUTDOWN REWRITE-AOF: a synchronous snapshot with queue states.
        With aof-enqueue-jobs-once yes, a marker file next to it says that
        the next start puts the queues back as they are now, whatever that
        start's own settings (a node started with flags only has no config
        file to keep the option in)."""
        self.disk.replace(self.path, self._snapshot())
        if self.server.config.aof_enqueue_jobs_once:
            self.disk.replace(self.restart_marker, _RESTART_MARKER_TEXT)

    @property
    def restart_marker(self) -> str:
        return self.path + RESTART_MARKER_SUFFIX

    def restart_marked(self) -> bool:
        """True when the AOF was written for a controlled restart."""
        return self.disk.read(self.restart_marker) is not None

    def clear_restart_mark(self) -> None:
        self.disk.remove(self.restart_marker)

    # ----------------------------------------------------------------- info

    def info(self) -> list[tuple[str, object]]:
        fields: list[tuple[str, object]] = [
            ("loading", int(self.loading)),
            ("aof_enabled", int(self.state != "off")),
            ("aof_state", self.state),
            ("aof_rewrite_in_progress", int(self.rewriting)),
            ("aof_rewrite_scheduled", 0),
            ("aof_last_rewrite_time_sec", self.last_rewrite_seconds),
            ("aof_current_rewrite_time_sec", -1),
            ("aof_last_bgrewrite_status", "ok" if self.last_rewrite_ok else "err"),
            ("aof_last_write_status", "ok" if self.last_write_error is None else "err"),
        ]
        if self.state != "off":
            fields += [
                ("aof_current_size", self.current_size),
                ("aof_base_size", self.base_size),
                ("aof_pending_rewrite", 0),
                ("aof_buffer_length", len(self._unwritten) + sum(map(len, self._buffer))),
                ("aof_rewrite_buffer_length", len(self.rewrite_buffer or ())),
                ("aof_pending_bio_fsync", 0),
                ("aof_delayed_fsync", 0),
            ]
        return fields


def _seconds_until(at_ms: int, now_ms: int) -> int:
    """Whole seconds from now to a node time, rounded up."""
    return max(0, -(-(at_ms - now_ms) // 1000))
