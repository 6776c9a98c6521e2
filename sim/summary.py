"""A sweep's one-page summary, as self-contained HTML.

What it holds: the seeds swept and the verdicts; every failure with its
first violations, its replay command and a link to its timeline
(sim/timeline.py) when the run wrote one; the probe coverage (each probe
with the share of seeds that hit it); and the per-seed speed distribution
(wall seconds per seed and virtual seconds per wall second, as quantiles
and a histogram). Every seed's line is at the bottom, folded.
"""

from __future__ import annotations

import html
import os
import re
from collections.abc import Sequence
from pathlib import Path

import attrs

QUANTILES = (0.0, 0.1, 0.5, 0.9, 1.0)


@attrs.frozen
class SeedResult:
    """One seed's verdict, as the sweep saw it."""

    seed: int
    rc: int
    lines: list[str]
    wall: float  # seconds, as the sweep measured them

    @property
    def ok(self) -> bool:
        return self.rc == 0

    @property
    def verdict(self) -> str:
        # FAIL: a checker's verdict; ERROR: the run itself broke.
        if self.rc == 0:
            return "PASS"
        return "FAIL" if self.rc == 1 and self.violations else f"ERROR (exit {self.rc})"

    @property
    def digest(self) -> str:
        return next((x for x in reversed(self.lines) if x.startswith("digest ")), "no digest")

    @property
    def violations(self) -> list[str]:
        return [x[len("VIOLATION ") :] for x in self.lines if x.startswith("VIOLATION ")]

    @property
    def probes_hit(self) -> list[str]:
        for line in self.lines:
            if line.startswith("probes hit: "):
                names = line[len("probes hit: ") :].split(";")[0]
                return [x.strip() for x in names.split(",") if x.strip() != "-"]
        return []

    @property
    def speed(self) -> float | None:
        """Virtual seconds per wall second of the run itself."""
        found = re.search(r"wall s \((\d+)x\)", "\n".join(self.lines))
        return float(found.group(1)) if found else None


def quantiles(values: Sequence[float]) -> list[float]:
    """min, p10, median, p90, max (nearest rank); empty: none."""
    ordered = sorted(values)
    if not ordered:
        return []
    return [ordered[min(len(ordered) - 1, int(q * len(ordered)))] for q in QUANTILES]


def histogram(values: Sequence[float], buckets: int = 10) -> list[tuple[float, float, int]]:
    """(low, high, count) over equal-width buckets."""
    if not values:
        return []
    low, high = min(values), max(values)
    width = (high - low) / buckets or 1.0
    counts = [0] * buckets
    for v in values:
        counts[min(buckets - 1, int((v - low) / width))] += 1
    return [(low + i * width, low + (i + 1) * width, n) for i, n in enumerate(counts)]


def render(
    results: Sequence[SeedResult],
    commands: dict[int, str],
    probes: Sequence[str],
    wall: float,
    page_dir: Path,
    mutant: str | None = None,
    commit: str = "unknown",
    traces: Path = Path("sim/traces"),
) -> str:
    seeds = [r.seed for r in results]
    failed = [r for r in results if not r.ok]
    span = f"{min(seeds)}..{max(seeds)}" if seeds else "none"
    body = [
        f"<h1>Sweep of seeds {span}</h1>",
        f"<p>commit <code>{commit[:12]}</code>: {len(results)} seeds, "
        f"{len(results) - len(failed)} passed, <b>{len(failed)} failed</b>, "
        f"{wall:.1f} s wall ({wall / max(1, len(results)):.2f} s per seed)</p>",
        _failures(failed, commands, page_dir, mutant, traces),
        _coverage(results, probes),
        _speed(results),
        _all_seeds(results),
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>sweep {span}</title><style>{_CSS}</style></head><body>"
        + "".join(body)
        + "</body></html>\n"
    )


def _failures(
    failed: Sequence[SeedResult],
    commands: dict[int, str],
    page_dir: Path,
    mutant: str | None,
    traces: Path,
) -> str:
    if not failed:
        return '<h2>Failures</h2><p id="failures">none</p>'
    rows = []
    for r in failed:
        texts = r.violations[:3] or r.lines[-3:]
        # Where the failing run (sim/runs.py report_run) drew its timeline.
        page = traces / f"seed-{r.seed}{'-' + mutant if mutant else ''}.html"
        href = html.escape(os.path.relpath(page, page_dir))
        link = f'<a href="{href}">timeline</a>' if page.exists() else ""
        rows.append(
            f'<tr class="failure"><td>{r.seed}</td><td>{html.escape(r.verdict)}</td>'
            f"<td>{'<br>'.join(html.escape(t) for t in texts)}</td>"
            f"<td><code>{html.escape(commands.get(r.seed, ''))}</code></td><td>{link}</td></tr>"
        )
    return (
        '<h2>Failures</h2><table id="failures"><tr><th>seed</th><th>verdict</th>'
        "<th>first violations</th><th>replay</th><th></th></tr>" + "".join(rows) + "</table>"
    )


def _coverage(results: Sequence[SeedResult], probes: Sequence[str]) -> str:
    rows = []
    for probe in probes:
        hits = sum(1 for r in results if probe in r.probes_hit)
        share = hits / max(1, len(results))
        rows.append(
            f'<tr class="probe"><td>{html.escape(probe)}</td><td>{hits}</td>'
            f"<td>{share:.0%}</td>"
            f'<td><span class="bar" style="width:{share * 200:.0f}px"></span></td></tr>'
        )
    return (
        '<h2>Probe coverage</h2><table id="probes"><tr><th>probe</th><th>seeds</th>'
        "<th>share</th><th></th></tr>" + "".join(rows) + "</table>"
    )


def _speed(results: Sequence[SeedResult]) -> str:
    walls = [r.wall for r in results]
    speeds = [s for r in results if (s := r.speed) is not None]
    head = "".join(f"<th>{name}</th>" for name in ("", "min", "p10", "median", "p90", "max"))
    rows = [
        ("wall s per seed", [f"{v:.2f}" for v in quantiles(walls)]),
        ("virtual s / wall s", [f"{v:.0f}x" for v in quantiles(speeds)]),
    ]
    table = "".join(
        f"<tr><td>{name}</td>{''.join(f'<td>{v}</td>' for v in values)}</tr>"
        for name, values in rows
    )
    buckets = histogram(walls)
    top = max((n for _, _, n in buckets), default=1)
    bars = "".join(
        f'<tr class="bucket"><td>{lo:.2f}-{hi:.2f} s</td><td>{n}</td>'
        f'<td><span class="bar" style="width:{n / top * 200:.0f}px"></span></td></tr>'
        for lo, hi, n in buckets
    )
    return (
        f'<h2>Speed per seed</h2><table id="speed"><tr>{head}</tr>{table}</table>'
        f'<table id="histogram"><tr><th>wall per seed</th><th>seeds</th><th></th></tr>{bars}</table>'
    )


def _all_seeds(results: Sequence[SeedResult]) -> str:
    rows = "".join(
        f"<tr><td>{r.seed}</td><td>{html.escape(r.verdict)}</td><td>{r.wall:.2f}</td>"
        f"<td>{'' if r.speed is None else f'{r.speed:.0f}x'}</td>"
        f"<td><code>{html.escape(r.digest.removeprefix('digest ')[:16])}</code></td></tr>"
        for r in results
    )
    return (
        "<details><summary>every seed</summary><table><tr><th>seed</th><th>verdict</th>"
        f"<th>wall s</th><th>speed</th><th>digest</th></tr>{rows}</table></details>"
    )


def write_summary(
    path: str,
    results: Sequence[SeedResult],
    commands: dict[int, str],
    probes: Sequence[str],
    wall: float,
    mutant: str | None,
    commit: str,
    traces: Path,
) -> str:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    page = render(results, commands, probes, wall, target.parent.resolve(), mutant, commit, traces)
    target.write_text(page)
    return path


_CSS = """
body{font:13px system-ui,sans-serif;margin:12px;color:#222}
h1{font-size:17px}h2{font-size:15px;margin-top:18px}
table{border-collapse:collapse;margin:4px 0}
td,th{border:1px solid #ddd;padding:2px 6px;text-align:left;vertical-align:top}
.failure td:nth-child(3){font-family:monospace;font-size:12px;color:#a01010}
.bar{display:inline-block;height:10px;background:#3498db}
code{background:#f3f3f3;padding:1px 4px}
"""
