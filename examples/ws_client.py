"""A Disque client over the WebSocket JSON protocol, with trio-websocket.

    python examples/ws_client.py [ws://127.0.0.1:8711/ws] [queue]

Subscribes to the queue's job events, adds a job, fetches it, acknowledges
it, and prints every frame the node sends. Requests run concurrently on the
socket, so replies are matched to requests by id (see docs/websocket.md).
"""

from __future__ import annotations

import itertools
import json
import sys
from typing import Any

import trio
from trio_websocket import WebSocketConnection, open_websocket_url


class DisqueWs:
    """Sends requests, routes replies to their callers and events to a channel."""

    def __init__(self, ws: WebSocketConnection) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.pending: dict[int, trio.MemorySendChannel[dict[str, Any]]] = {}
        # Events wait here for the consumer; 100 is plenty for an example.
        self._event_send, self.events = trio.open_memory_channel[dict[str, Any]](100)

    async def reader(self) -> None:
        """The only task that reads the socket."""
        while True:
            message = json.loads(await self.ws.get_message())
            if "event" in message:
                await self._event_send.send(message)
            elif (waiting := self.pending.pop(message["id"], None)) is not None:
                await waiting.send(message)

    async def request(self, **fields: Any) -> Any:
        """Send one request; return its result, raise on an error reply."""
        request_id = next(self.ids)
        send, receive = trio.open_memory_channel[dict[str, Any]](1)
        self.pending[request_id] = send
        await self.ws.send_message(json.dumps({"id": request_id, **fields}))
        reply = await receive.receive()
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return reply["result"]

    async def call(self, *cmd: Any) -> Any:
        return await self.request(cmd=list(cmd))


async def main(url: str, queue: str) -> None:
    async with open_websocket_url(url) as ws, trio.open_nursery() as nursery:
        disque = DisqueWs(ws)
        nursery.start_soon(disque.reader)
        await disque.request(subscribe=[f"jobs:{queue}"])
        job_id = await disque.call("ADDJOB", queue, "hello over WebSocket", 0)
        print("added", job_id)
        [[_, got_id, body]] = await disque.call("GETJOB", "TIMEOUT", 1000, "FROM", queue)
        print("got", got_id, repr(body))
        print("acked", await disque.call("ACKJOB", got_id))
        print("queue now", await disque.call("QLEN", queue))
        with trio.move_on_after(0.5):  # the events of the job's life
            async for event in disque.events:
                print("event", event["data"])
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    args = sys.argv[1:]
    trio.run(
        main,
        args[0] if args else "ws://127.0.0.1:8711/ws",
        args[1] if len(args) > 1 else "example",
    )
