"""The WebSocket JSON protocol as data (protocol/wsjson.py), no sockets."""

from __future__ import annotations

import json

import pytest

from disque_trio.protocol import wsjson
from disque_trio.protocol.replies import NULL_ARRAY, ReplyError, Status, Verbatim


def test_command_requests() -> None:
    request = wsjson.parse_request(
        '{"id": [1, "a"], "cmd": ["ADDJOB", "q", {"base64": "/wA="}, 0, 1.5, "é"]}'
    )
    assert request == wsjson.CommandRequest(
        [1, "a"], [b"ADDJOB", b"q", b"\xff\x00", b"0", b"1.5", "é".encode()]
    )
    assert wsjson.parse_request('{"cmd": ["PING"]}') == wsjson.CommandRequest(None, [b"PING"])


def test_subscription_requests() -> None:
    request = wsjson.parse_request('{"id": 9, "subscribe": ["stats", "jobs:a:b", "stats"]}')
    assert request == wsjson.SubscribeRequest(9, ("stats", "jobs:a:b"))
    assert wsjson.parse_request('{"unsubscribe": []}') == wsjson.UnsubscribeRequest(None, ())


def test_cluster_topic_and_findjob_requests() -> None:
    request = wsjson.parse_request('{"id": 3, "subscribe": ["cluster"]}')
    assert request == wsjson.SubscribeRequest(3, ("cluster",))
    request = wsjson.parse_request('{"id": 4, "findjob": "D-1234"}')
    assert request == wsjson.FindJobRequest(4, "D-1234")  # the node checks the ID
    assert wsjson.result_message(4, {"id": "D-1", "copies": []}) == (
        '{"id":4,"result":{"id":"D-1","copies":[]}}'
    )


@pytest.mark.parametrize(
    ("text", "request_id", "message"),
    [
        ("{", None, "ERR invalid JSON"),
        ('{"id": NaN, "cmd": ["PING"]}', None, "ERR invalid JSON"),
        ('"PING"', None, "ERR a request must be a JSON object"),
        ('{"id": 1}', 1, "ERR a request needs exactly one of"),
        ('{"id": 1, "cmd": ["PING"], "subscribe": ["stats"]}', 1, "ERR a request needs"),
        ('{"id": 2, "cmd": ["PING"], "xyz": 0}', 2, "ERR unknown field 'xyz'"),
        ('{"id": 3, "cmd": []}', 3, "ERR 'cmd' must be a non-empty array"),
        ('{"id": 4, "cmd": ["PING", null]}', 4, "ERR argument 1 must be"),
        ('{"id": 4, "cmd": ["PING", false]}', 4, "ERR argument 1 must be"),
        ('{"id": 4, "cmd": ["PING", ["x"]]}', 4, "ERR argument 1 must be"),
        ('{"id": 4, "cmd": ["PING", {"base64": "x", "y": 1}]}', 4, "ERR argument 1 must be"),
        ('{"id": 5, "cmd": ["PING", {"base64": "***"}]}', 5, "ERR argument 1 is not valid base64"),
        ('{"id": 6, "cmd": ["PING", "\\ud800"]}', 6, "ERR argument 1 is not valid Unicode"),
        ('{"id": 7, "subscribe": []}', 7, "ERR 'subscribe' needs at least one topic"),
        ('{"id": 7, "subscribe": "stats"}', 7, "ERR 'subscribe' must be an array"),
        ('{"id": 7, "subscribe": ["jobs:"]}', 7, "ERR unknown topic 'jobs:'"),
        ('{"id": 8, "findjob": ["D-1"]}', 8, "ERR 'findjob' must be a job ID"),
        ('{"id": 8, "findjob": "D-1", "cmd": ["PING"]}', 8, "ERR a request needs exactly one"),
    ],
)
def test_bad_requests(text: str, request_id: object, message: str) -> None:
    with pytest.raises(wsjson.BadRequest) as bad:
        wsjson.parse_request(text)
    assert bad.value.id == request_id
    assert bad.value.message.startswith(message)


def test_reply_values_as_json() -> None:
    reply = [
        Status("OK"),
        b"text",
        b"\xff",
        "name\udcff",  # a queue name that came in as arbitrary bytes
        7,
        True,
        None,
        NULL_ARRAY,
        1.5,
        float("inf"),
        Verbatim("# Server\r\n"),
        [[b"q", b"id"]],
        {"key": [1]},
    ]
    assert wsjson.to_json(reply) == [
        "OK",
        "text",
        {"base64": "/w=="},
        {"base64": "bmFtZf8="},
        7,
        True,
        None,
        None,
        1.5,
        "inf",
        "# Server\r\n",
        [["q", "id"]],
        {"key": [1]},
    ]


def test_messages() -> None:
    assert json.loads(wsjson.reply_message(3, 5)) == {"id": 3, "result": 5}
    error = ReplyError("NOREPL", "Timeout reached")
    assert json.loads(wsjson.reply_message("x", error)) == {
        "id": "x",
        "error": "NOREPL Timeout reached",
    }
    assert json.loads(wsjson.event_message("job", {"what": "acked"})) == {
        "event": "job",
        "data": {"what": "acked"},
    }


def test_ids_that_no_reply_could_carry_are_refused() -> None:
    # 1e400 parses as inf, which JSON cannot carry back.
    for text in ('{"id": 1e400, "cmd": ["PING"]}', '{"id": 1, "cmd": ["PING", -1e999]}'):
        with pytest.raises(wsjson.BadRequest) as refused:
            wsjson.parse_request(text)
        assert refused.value.message.startswith("ERR invalid JSON: number")
        assert refused.value.id is None
    deep = 33
    text = '{"id": ' + "[" * deep + "]" * deep + ', "cmd": ["PING"]}'
    with pytest.raises(wsjson.BadRequest) as refused:
        wsjson.parse_request(text)
    assert refused.value.message == "ERR 'id' is nested too deeply (limit 32)"
    ok = '{"id": ' + '{"a": [' * 16 + "1" + "]}" * 16 + ', "cmd": ["PING"]}'
    request = wsjson.parse_request(ok)
    assert json.loads(wsjson.reply_message(request.id, "x"))["id"] == request.id


def test_a_lone_surrogate_in_an_id_is_echoed_escaped() -> None:
    request = wsjson.parse_request('{"id": "\\ud800", "cmd": ["PING"]}')
    frame = wsjson.reply_message(request.id, "PONG")
    frame.encode("utf-8")  # what the socket needs
    assert frame == '{"id":"\\ud800","result":"PONG"}'
    assert json.loads(frame)["id"] == "\ud800"
    # Text that can travel stays unescaped.
    assert wsjson.reply_message("é", "✓") == '{"id":"é","result":"✓"}'
