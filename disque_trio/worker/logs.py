"""The worker's logs: ``JobLog`` (one line per job) and the fields every
job-related record carries, and ``JsonLogFormatter`` for
``--log-format json``."""

from __future__ import annotations

import json
import logging

import anyio

from .context import JobContext, Next, log


def describe(error: BaseException | None) -> str:
    """``"ValueError: text"`` (the type alone when the text is empty)."""
    if error is None:
        return ""
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


# The notes of the pieces that go into the log records.
_NOTED = (
    "dead_letter_id",
    "working",
    "nacked",
    "retry_in",
    "nack_error",
    "enqueued",
    "enqueue_error",
    "ack_error",
)


def job_fields(ctx: JobContext, **more: object) -> dict[str, object]:
    """The job's fields, for a log record's ``extra``."""
    fields: dict[str, object] = {
        "job_id": ctx.job.id,
        "queue": ctx.job.queue,
        "outcome": ctx.outcome,
        "deliveries": ctx.job.deliveries,
        "nacks": ctx.job.nacks,
        "additional_deliveries": ctx.job.additional_deliveries,
        "duration_ms": round(ctx.duration * 1000, 3),
        "handler": ctx.spec.name,
    }
    if ctx.error is not None:
        fields["error"] = describe(ctx.error)
    for key in _NOTED:
        if key in ctx.notes:
            fields[key] = ctx.notes[key]
    fields.update(more)
    return fields


class JobLog:
    """One log line per job, with its fields as ``extra`` (docs/worker.md:
    ``--log-format json`` prints them as JSON). A job done is logged at
    ``success_level`` (DEBUG: at thousands of jobs a second, a line each
    is noise and the biggest cost of a job after its network round trips;
    the metrics count them), failed, interrupted and lost ones at WARNING,
    dead ones at ERROR. Nothing is built for a line the level drops."""

    def __init__(self, success_level: int = logging.DEBUG) -> None:
        self.levels = {"done": success_level, "dead": logging.ERROR}

    async def __call__(self, ctx: JobContext, call_next: Next) -> None:
        try:
            await call_next()
        finally:
            ctx.finished = anyio.current_time()
            level = self.levels.get(ctx.outcome, logging.WARNING)
            if log.isEnabledFor(level):
                self._emit(ctx, level)

    @staticmethod
    def _emit(ctx: JobContext, level: int) -> None:
        text = f"job {ctx.outcome} queue={ctx.job.queue} id={ctx.job.id} "
        text += f"deliveries={ctx.job.deliveries} duration_ms={ctx.duration * 1000:.1f}"
        if ctx.error is not None:
            text += f" error={describe(ctx.error)!r}"
        if "dead_letter_id" in ctx.notes:
            text += f" dead_letter_id={ctx.notes['dead_letter_id']}"
        log.log(level, "%s", text, extra=job_fields(ctx, event="job"))


class JsonLogFormatter(logging.Formatter):
    """Log records as one JSON object per line, with the job fields."""

    FIELDS = (
        "event",
        "job_id",
        "queue",
        "outcome",
        "deliveries",
        "nacks",
        "additional_deliveries",
        "duration_ms",
        "handler",
        "error",
        *_NOTED,
    )

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in self.FIELDS:
            if hasattr(record, name):
                doc[name] = getattr(record, name)
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)
