"""The WebSocket JSON protocol as data: request text in, reply objects out.

No I/O here (like ``resp.py``): the gateway in ``server/websocket.py`` reads
frames, calls :func:`parse_request`, runs the command, and sends what
:func:`reply_message` or :func:`error_message` return. See
``docs/websocket.md`` for the protocol as users see it.

Requests (one JSON object per text frame)::

    {"id": <any JSON>, "cmd": ["ADDJOB", "q", "body", 0]}
    {"id": <any JSON>, "subscribe": ["stats", "nodes", "jobs:<queue>"]}
    {"id": <any JSON>, "unsubscribe": ["stats"]}       ([] means all)
    {"id": <any JSON>, "findjob": "D-..."}              (a job across the cluster)

Arguments are strings (sent as their UTF-8 bytes), numbers (sent as their
decimal text) or ``{"base64": "..."}`` for bytes that are not text.

Replies carry the request's ``id`` (null when it had none or could not be
read) and either ``result`` or ``error``. How a reply value maps to JSON:

=========================  ==================================================
Reply value                JSON
=========================  ==================================================
bulk or simple string      string; bytes that are not UTF-8: ``{"base64": s}``
integer, double            number (a non-finite double: "inf", "-inf", "nan")
boolean (RESP3)            true / false
nil, null array            null
array                      array (nested as deep as the reply is)
map (CONFIG GET, HELLO 3)  object
error                      ``"error": "CODE message"`` (no leading '-')
=========================  ==================================================
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from typing import Any, TypeAlias

import attrs

from .replies import NULL_ARRAY, Reply, ReplyError

JsonValue: TypeAlias = Any  # what json.loads returns: no finer type helps here

TOPIC_STATS = "stats"
TOPIC_NODES = "nodes"
TOPIC_CLUSTER = "cluster"
TOPIC_JOBS_PREFIX = "jobs:"
_REQUEST_KINDS = ("cmd", "subscribe", "unsubscribe", "findjob")
MAX_ID_DEPTH = 32  # arrays and objects nested in a request's id


@attrs.frozen
class CommandRequest:
    id: JsonValue
    argv: list[bytes]


@attrs.frozen
class SubscribeRequest:
    id: JsonValue
    topics: tuple[str, ...]


@attrs.frozen
class UnsubscribeRequest:
    id: JsonValue
    topics: tuple[str, ...]  # empty: every topic of the socket


@attrs.frozen
class FindJobRequest:
    """A job looked up on every node that may hold a copy (the node asks
    them over the cluster bus: server/clusterview.py)."""

    id: JsonValue
    job_id: str


Request: TypeAlias = CommandRequest | SubscribeRequest | UnsubscribeRequest | FindJobRequest


class BadRequest(Exception):
    """A frame that is not a valid request; answered with ``error``, the
    socket stays usable. ``id`` is the request's id when it could be read."""

    def __init__(self, request_id: JsonValue, message: str) -> None:
        super().__init__(message)
        self.id = request_id
        self.message = message


def _refuse_constant(name: str) -> float:
    # json.loads accepts NaN and Infinity by default; they are not JSON.
    raise ValueError(f"{name} is not valid JSON")


def _depth(value: JsonValue) -> int:
    """How deeply arrays and objects nest in ``value`` (0 for a scalar)."""
    depth = 0
    level: list[JsonValue] = [value]
    while level:
        containers = [v for v in level if isinstance(v, (list, dict))]
        if not containers:
            break
        depth += 1
        level = [child for c in containers for child in (c.values() if isinstance(c, dict) else c)]
    return depth


def _finite_float(text: str) -> float:
    # 1e400 parses as inf, which no reply could carry back (an id echoed).
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def parse_request(text: str) -> Request:
    """The request in one text frame; BadRequest if it is not one."""
    try:
        obj = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except (ValueError, RecursionError) as e:
        raise BadRequest(None, f"ERR invalid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise BadRequest(None, "ERR a request must be a JSON object")
    request_id = obj.get("id")
    if _depth(request_id) > MAX_ID_DEPTH:
        # Echoed in the reply: a JSON encoder nests as deep as the decoder
        # did, and a reply that cannot be encoded would end the session.
        raise BadRequest(None, f"ERR 'id' is nested too deeply (limit {MAX_ID_DEPTH})")
    unknown = sorted(k for k in obj if k != "id" and k not in _REQUEST_KINDS)
    if unknown:
        raise BadRequest(request_id, f"ERR unknown field '{unknown[0]}' in request")
    kinds = [k for k in _REQUEST_KINDS if k in obj]
    if len(kinds) != 1:
        raise BadRequest(
            request_id,
            "ERR a request needs exactly one of 'cmd', 'subscribe', 'unsubscribe', 'findjob'",
        )
    return _request(request_id, kinds[0], obj[kinds[0]])


def _request(request_id: JsonValue, kind: str, value: JsonValue) -> Request:
    """The request of one kind, from the value its field holds."""
    if kind == "cmd":
        return CommandRequest(request_id, _argv(request_id, value))
    if kind == "findjob":
        if not isinstance(value, str):
            raise BadRequest(request_id, "ERR 'findjob' must be a job ID (a string)")
        return FindJobRequest(request_id, value)
    topics = _topics(request_id, kind, value)
    if kind == "subscribe":
        if not topics:
            raise BadRequest(request_id, "ERR 'subscribe' needs at least one topic")
        return SubscribeRequest(request_id, topics)
    return UnsubscribeRequest(request_id, topics)


def _argv(request_id: JsonValue, cmd: JsonValue) -> list[bytes]:
    if not isinstance(cmd, list) or not cmd:
        raise BadRequest(request_id, "ERR 'cmd' must be a non-empty array")
    return [_arg(request_id, i, value) for i, value in enumerate(cmd)]


def _arg(request_id: JsonValue, index: int, value: JsonValue) -> bytes:
    if isinstance(value, str):
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequest(
                request_id,
                f"ERR argument {index} is not valid Unicode text (send bytes as base64)",
            ) from None
    if isinstance(value, bool) or value is None:
        pass  # JSON true/false/null are not arguments (bool is an int in Python)
    elif isinstance(value, int | float):
        return str(value).encode()
    elif isinstance(value, dict) and set(value) == {"base64"} and isinstance(value["base64"], str):
        try:
            return base64.b64decode(value["base64"], validate=True)
        except (binascii.Error, ValueError):
            raise BadRequest(request_id, f"ERR argument {index} is not valid base64") from None
    raise BadRequest(
        request_id,
        f'ERR argument {index} must be a string, a number or {{"base64": "..."}}',
    )


def _topics(request_id: JsonValue, kind: str, topics: JsonValue) -> tuple[str, ...]:
    if not isinstance(topics, list) or not all(isinstance(t, str) for t in topics):
        raise BadRequest(request_id, f"ERR '{kind}' must be an array of topic names")
    for topic in topics:
        if not is_topic(topic):
            raise BadRequest(
                request_id, f"ERR unknown topic '{topic}' (stats, nodes, cluster or jobs:<queue>)"
            )
    return tuple(dict.fromkeys(topics))  # deduplicated, in order


def is_topic(topic: str) -> bool:
    return topic in (TOPIC_STATS, TOPIC_NODES, TOPIC_CLUSTER) or (
        topic.startswith(TOPIC_JOBS_PREFIX) and len(topic) > len(TOPIC_JOBS_PREFIX)
    )


# ------------------------------------------------------------------ replies


def reply_message(request_id: JsonValue, reply: Reply) -> str:
    """The frame answering a request: ``result``, or ``error`` for an error."""
    if isinstance(reply, ReplyError):
        return error_message(request_id, reply.line)
    return dumps({"id": request_id, "result": to_json(reply)})


def result_message(request_id: JsonValue, result: JsonValue) -> str:
    """The frame answering a request with data that is JSON already."""
    return dumps({"id": request_id, "result": result})


def error_message(request_id: JsonValue, message: str) -> str:
    return dumps({"id": request_id, "error": message})


def event_message(event: str, data: JsonValue) -> str:
    return dumps({"event": event, "data": data})


def dumps(obj: JsonValue) -> str:
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            # A lone surrogate, from a client's JSON ("id": "\ud800" echoed,
            # a topic in an error): not UTF-8, so escaped as JSON allows.
            return json.dumps(obj, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    return text


def to_json(reply: Reply) -> JsonValue:
    """A reply value as JSON-ready Python data (see the table above)."""
    if isinstance(reply, bytes):
        return bytes_json(reply)
    if isinstance(reply, str):
        return text_json(reply)
    if isinstance(reply, bool):
        return reply
    if isinstance(reply, int):
        return reply
    if isinstance(reply, list | tuple):
        return [to_json(item) for item in reply]
    if reply is None or reply is NULL_ARRAY:
        return None
    if isinstance(reply, float):
        return reply if math.isfinite(reply) else str(reply)
    if isinstance(reply, dict):
        return {_key(k): to_json(v) for k, v in reply.items()}
    if isinstance(reply, ReplyError):
        return {"error": reply.line}  # an error inside an array
    raise TypeError(f"not a reply value: {type(reply).__name__}")


def bytes_json(data: bytes) -> JsonValue:
    """UTF-8 text as a string, anything else as ``{"base64": ...}``."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


def text_json(text: str) -> JsonValue:
    """A name held as str. Names that came in as arbitrary bytes hold them
    as surrogate escapes (core/args.text); those go out as base64."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        try:
            return bytes_json(text.encode("utf-8", "surrogateescape"))
        except UnicodeEncodeError:
            return bytes_json(text.encode("utf-8", "replace"))
    return text


def _key(key: str | bytes) -> str:
    raw = key if isinstance(key, bytes) else key.encode("utf-8", "surrogateescape")
    return raw.decode("utf-8", "replace")
