"""``DeadLetter``: what a job moved to ``<queue>:dead`` holds."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass


@dataclass(frozen=True)
class DeadLetter:
    """A job moved to ``<queue>:dead``: its body there is this, as JSON
    (the original body as text when it is UTF-8, else base64)."""

    id: str
    queue: str
    body: bytes
    error: str
    deliveries: int
    nacks: int
    additional_deliveries: int
    traceback: str = ""

    def to_json(self) -> bytes:
        doc: dict[str, object] = {
            "id": self.id,
            "queue": self.queue,
            "error": self.error,
            "deliveries": self.deliveries,
            "nacks": self.nacks,
            "additional_deliveries": self.additional_deliveries,
            "traceback": self.traceback,
        }
        try:
            doc["body"] = self.body.decode("utf-8")
        except UnicodeDecodeError:
            doc["body_base64"] = base64.b64encode(self.body).decode("ascii")
        return json.dumps(doc, ensure_ascii=False).encode("utf-8")

    @classmethod
    def from_body(cls, data: bytes) -> DeadLetter:
        doc = json.loads(data)
        body = (
            doc["body"].encode("utf-8")
            if "body" in doc
            else base64.b64decode(doc.get("body_base64", ""))
        )
        return cls(
            id=doc["id"],
            queue=doc["queue"],
            body=body,
            error=doc.get("error", ""),
            deliveries=int(doc.get("deliveries", 0)),
            nacks=int(doc.get("nacks", 0)),
            additional_deliveries=int(doc.get("additional_deliveries", 0)),
            traceback=doc.get("traceback", ""),
        )
