"""``TimeLimit``: a handler running past its ``timeout`` is cancelled."""

from __future__ import annotations

import anyio

from .context import HandlerTimeout, JobContext, Next


class TimeLimit:
    """Cancel a handler that runs past its ``timeout``; raise HandlerTimeout."""

    async def __call__(self, ctx: JobContext, call_next: Next) -> None:
        limit = ctx.spec.timeout
        if limit is None:
            await call_next()
            return
        with anyio.move_on_after(limit) as scope:
            await call_next()
        if scope.cancelled_caught:
            raise HandlerTimeout(f"handler ran past its {limit:g} s timeout")
