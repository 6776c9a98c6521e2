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


class Trace:
    """Events collected in memory, in the order they happened."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        # The last instant's time as written (many events share an instant).
        self._at = -1.0
        self._at_text = ""

    def record(self, node: str, category: str, data: dict[str, Any]) -> None:
        self._append(node, category, encode(data))

    def record_delivery(self, src: str, dst: str, size: int) -> None:
        """``record("net", "deliver", {"src": src, "dst": dst, "len": size})``
        without the JSON encoder: the network's deliveries are most of a
        run's events (the same bytes)."""
        self._append(
            "net", "deliver", f'{{"dst":{_string(dst)},"len":{int(size)},"src":{_string(src)}}}'
        )

    def _append(self, node: str, category: str, data: str) -> None:
        """One event, its ``data`` already encoded: encode({"t": round(now,
        6), "node": node, "cat": category, "data": data}) spelled out (keys
        sorted, no spaces): the same bytes."""
        try:
            now = trio.current_time()
        except RuntimeError:  # outside trio.run
            now = 0.0
        if now != self._at:
            self._at = now
            self._at_text = float.__repr__(round(now, 6))
        self.lines.append(
            f'{{"cat":{_string(category)},"data":{data},'
            f'"node":{_string(node)},"t":{self._at_text}}}'
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
