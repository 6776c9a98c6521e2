"""``Metrics``: Prometheus counters and a duration histogram per queue,
served over HTTP by the worker's own event loop."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.abc

from .context import JobContext, Next


class Metrics:
    """Prometheus metrics per queue: ``disque_worker_jobs_done_total``,
    ``..._jobs_failed_total``, ``..._jobs_dead_lettered_total``,
    ``..._jobs_interrupted_total``, ``..._handler_duration_seconds``."""

    def __init__(self, registry: Any = None) -> None:
        try:
            import prometheus_client as prom
        except ImportError:  # pragma: no cover - depends on the install
            raise RuntimeError(
                "metrics need prometheus_client, the extra 'worker' (from a clone:"
                " pip install -c constraints.txt -e '.[worker]')"
            ) from None
        self.registry = registry if registry is not None else prom.CollectorRegistry()
        self.prom = prom
        labels = ["queue"]
        self.done = prom.Counter(
            "disque_worker_jobs_done",
            "Jobs handled and acknowledged",
            labels,
            registry=self.registry,
        )
        self.failed = prom.Counter(
            "disque_worker_jobs_failed",
            "Handler runs that raised or timed out",
            labels,
            registry=self.registry,
        )
        self.dead = prom.Counter(
            "disque_worker_jobs_dead_lettered",
            "Jobs moved to the dead-letter queue",
            labels,
            registry=self.registry,
        )
        self.interrupted = prom.Counter(
            "disque_worker_jobs_interrupted",
            "Handler runs cancelled by a shutdown (the job given back)",
            labels,
            registry=self.registry,
        )
        self.duration = prom.Histogram(
            "disque_worker_handler_duration_seconds",
            "Time in the handler and the pieces inside Metrics",
            labels,
            registry=self.registry,
        )
        self._children: dict[str, dict[str, Any]] = {}

    async def __call__(self, ctx: JobContext, call_next: Next) -> None:
        start = anyio.current_time()
        try:
            await call_next()
        finally:
            # The queue's labelled children, looked up once (labels() costs
            # more than the counting itself).
            queue = ctx.job.queue
            children = self._children.get(queue) or self._label(queue)
            children["duration"].observe(anyio.current_time() - start)
            outcome = ctx.outcome
            if outcome in ("done", "interrupted"):
                children[outcome].inc()
            elif outcome in ("failed", "dead"):
                if ctx.error is not None:
                    children["failed"].inc()
                if outcome == "dead":
                    children["dead"].inc()

    def _label(self, queue: str) -> dict[str, Any]:
        children = {
            "done": self.done.labels(queue),
            "failed": self.failed.labels(queue),
            "dead": self.dead.labels(queue),
            "interrupted": self.interrupted.labels(queue),
            "duration": self.duration.labels(queue),
        }
        self._children[queue] = children
        return children

    def exposition(self) -> tuple[bytes, str]:
        return self.prom.generate_latest(self.registry), self.prom.CONTENT_TYPE_LATEST

    async def serve(
        self, host: str, port: int, *, task_status: Any = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """GET /metrics over plain HTTP/1.0 on (host, port)."""
        listener = await anyio.create_tcp_listener(
            local_host=host, local_port=port, reuse_port=False
        )
        task_status.started(listener.extra(anyio.abc.SocketAttribute.local_port))
        async with listener:
            await listener.serve(self._http)

    async def _http(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            request = b""
            with anyio.move_on_after(5):
                while b"\r\n\r\n" not in request and len(request) < 8192:
                    try:
                        request += await stream.receive(4096)
                    except (anyio.EndOfStream, anyio.BrokenResourceError):
                        return
            parts = request.split(b" ", 2)
            path = parts[1].split(b"?")[0] if len(parts) > 2 else b""
            if parts[0] == b"GET" and path in (b"/metrics", b"/"):
                body, ctype = self.exposition()
                head = f"HTTP/1.0 200 OK\r\nContent-Type: {ctype}\r\n"
            else:
                body, head = (
                    b"not found\n",
                    "HTTP/1.0 404 Not Found\r\nContent-Type: text/plain\r\n",
                )
            head += f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            try:
                await stream.send(head.encode("ascii") + body)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass
