"""The run's trace: every event as one JSON line, digested with sha256.

The digest covers the events only (not the header, which names the commit
and package versions), so a seed's digest is stable across checkouts until
behaviour changes."""

from __future__ import annotations

import hashlib
import json
import json.encoder
from collections.abc import Callable
from typing import Any

import trio
import trio.testing


def _make_encode() -> Callable[[object], str]:
    """``json.dumps(obj, sort_keys=True, separators=(",", ":"))``, built
    once: ``dumps`` with options builds a new encoder at every call, and the
    trace encodes every event (the output is the same, byte for byte)."""
    encoder = json.JSONEncoder(sort_keys=True, separators=(",", ":"), check_circular=False)
    c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
    if c_make_encoder is None:  # no C accelerator: the plain path
        return encoder.encode
    iterencode = c_make_encoder(
        None,  # markers: no circular check (events are plain, acyclic data)
        encoder.default,
        json.encoder.encode_basestring_ascii,
        None,  # indent
        encoder.key_separator,
        encoder.item_separator,
        encoder.sort_keys,
        encoder.skipkeys,
        encoder.allow_nan,
    )

    def encode(obj: object) -> str:
        return "".join(iterencode(obj, 0))

    return encode


encode = _make_encode()
_string: Callable[[str], str] = json.encoder.encode_basestring_ascii


def delivery_text(src: str, dst: str) -> tuple[str, str]:
    """The text of a delivery event from ``src`` to ``dst`` before its size,
    and between its size and its time (``Trace.record_delivery_between``)."""
    return (
        f'{{"cat":"deliver","data":{{"dst":{_string(dst)},"len":',
        f',"src":{_string(src)}}},"node":"net","t":',
    )


class Trace:
    """Events collected in memory, in the order they happened."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        # The last instant's time as written (many events share an instant).
        self._at = -1.0
        self._at_text = ""
        # The run's clock while its trio.run is under way (the World sets
        # it, at rate 0): its virtual time is read off it directly.
        self.clock: trio.testing.MockClock | None = None

    def record(self, node: str, category: str, data: dict[str, Any]) -> None:
        self._append(node, category, encode(data))

    def record_delivery(self, src: str, dst: str, size: int) -> None:
        """``record("net", "deliver", {"src": src, "dst": dst, "len": size})``
        without the JSON encoder: the network's deliveries are most of a
        run's events (the same bytes)."""
        self.record_delivery_between(delivery_text(src, dst), size)

    def record_delivery_between(self, between: tuple[str, str], size: int) -> None:
        """``record_delivery`` with the pipe's ``delivery_text(src, dst)``,
        made once per pipe: the line is two constants around the size and
        the time."""
        at = self._time_text()
        self.lines.append(f"{between[0]}{int(size)}{between[1]}{at}}}")

    def record_bus(
        self, node: str, ev: str, msg: str, peer_key: str, peer: str, ids: list[str]
    ) -> None:
        """``record(node, "bus", {"ev": ev, "msg": msg, peer_key: peer,
        "ids": ids})`` for ``peer_key`` "from" or "to", without the JSON
        encoder (every bus message about jobs is traced twice; the same
        bytes, keys in sorted order)."""
        s = _string
        listed = ",".join([s(i) for i in ids])
        if peer_key == "from":
            data = f'{{"ev":{s(ev)},"from":{s(peer)},"ids":[{listed}],"msg":{s(msg)}}}'
        elif peer_key == "to":
            data = f'{{"ev":{s(ev)},"ids":[{listed}],"msg":{s(msg)},"to":{s(peer)}}}'
        else:
            raise ValueError(f"peer_key must be 'from' or 'to', not {peer_key!r}")
        self._append(node, "bus", data)

    def record_job(self, node: str, ev: str, job_id: str, via: str | None) -> None:
        """``record(node, "job", {"ev": ev, "id": job_id})``, with ``"via":
        via`` unless it is None, without the JSON encoder (the same bytes)."""
        s = _string
        if via is None:
            data = f'{{"ev":{s(ev)},"id":{s(job_id)}}}'
        else:
            data = f'{{"ev":{s(ev)},"id":{s(job_id)},"via":{s(via)}}}'
        self._append(node, "job", data)

    def _time_text(self) -> str:
        """The time of an event now, as written (``round(now, 6)``; 0
        outside ``trio.run``), formatted once per instant."""
        clock = self.clock
        if clock is not None:
            now = clock._virtual_base  # trio.current_time() at rate 0
        else:
            try:
                now = trio.current_time()
            except RuntimeError:  # outside trio.run
                now = 0.0
        if now != self._at:
            self._at = now
            self._at_text = float.__repr__(round(now, 6))
        return self._at_text

    def _append(self, node: str, category: str, data: str) -> None:
        """One event, its ``data`` already encoded: encode({"t": round(now,
        6), "node": node, "cat": category, "data": data}) spelled out (keys
        sorted, no spaces): the same bytes."""
        at = self._time_text()
        self.lines.append(
            f'{{"cat":{_string(category)},"data":{data},"node":{_string(node)},"t":{at}}}'
        )

    def digest(self) -> str:
        h = hashlib.sha256()
        for line in self.lines:
            h.update(line.encode())
            h.update(b"\n")
        return h.hexdigest()

    def dump(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            for line in self.lines:
                f.write(line + "\n")

    def write(self, path: str, header: dict[str, Any], footer: dict[str, Any]) -> tuple[str, str]:
        """The trace as JSON Lines (a header line, one line per event, a
        footer line) at ``path`` and a human log beside it (``.log``)."""
        log_path = path.rsplit(".", 1)[0] + ".log"
        with open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps({"header": header}, sort_keys=True) + "\n")
            for line in self.lines:
                f.write(line + "\n")
            f.write(json.dumps({"footer": footer}, sort_keys=True) + "\n")
        with open(log_path, "w", encoding="utf-8") as f:
            for key in ("seed", "replay", "commit"):
                f.write(f"# {key}: {header.get(key)}\n")
            for line in self.lines:
                f.write(human(line) + "\n")
            for text in footer.get("violations", []):
                f.write(f"# VIOLATION {text}\n")
        return path, log_path


def human(line: str) -> str:
    """One trace event as one readable line."""
    event = json.loads(line)
    data = event["data"]
    parts = " ".join(f"{k}={v}" for k, v in sorted(data.items()))
    return f"{event['t']:10.4f} {event['node']:>8} {event['cat']:<7} {parts}"
