"""Sweeps: seeds in long-lived worker processes give the digests of fresh
``python -m sim run --seed N`` processes, a planted bug stays in its own
seed, the wall-clock guard replaces a worker, and the summary page holds
failures, probe coverage and speeds."""

from __future__ import annotations

import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

from sim.summary import histogram, quantiles
from sim.sweep import SeedWorker, sweep
from sim.world import PROBES

from .conftest import sim_cli


def fresh_digest(seed: int) -> str:
    out = sim_cli("run", "--seed", str(seed), "--quiet")
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout.strip().splitlines()[-1]


def test_a_worker_gives_fresh_process_digests_and_keeps_mutants_to_their_seed() -> None:
    worker = SeedWorker()
    try:
        answers = [
            worker.run({"seed": 1, "mutant": "aof-write-dropped"}, 120),
            worker.run({"seed": 1}, 120),
            worker.run({"seed": 5}, 120),
            worker.run({"seed": 8}, 120),
        ]
    finally:
        worker.close()
    mutated, *plain = answers
    assert mutated[0] == 1 and any(x.startswith("VIOLATION ") for x in mutated[1])
    assert all(rc == 0 for rc, _ in plain), plain
    # The mutant's run left no patch behind: seed 1 again is seed 1 fresh.
    assert [lines[-1] for _, lines in plain] == [fresh_digest(s) for s in (1, 5, 8)]


def live_in_group(pgid: int) -> list[int]:
    """Processes of the group that are not zombies (a killed child waits
    for init to reap it), from /proc."""
    live = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            live.append(int(stat.parent.name))
    return live


def test_the_guard_kills_a_late_seed_and_its_worker_is_replaced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    worker = SeedWorker()
    rc, lines = worker.run({"seed": 1, "nodes": 7, "duration": 30}, 0.3)
    assert rc == 2 and "wall-clock guard" in lines[0]
    assert not worker.alive
    deadline = time.monotonic() + 5  # SIGKILL is delivered, not instant
    while live_in_group(worker.proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not live_in_group(worker.proc.pid)  # the forked child went with it
    # In a sweep, the next seed gets a new worker (the old one's pipe is closed).
    rc = sweep(range(1, 3), 1, 7, 30, save=False, limit=0.3, summary=str(tmp_path / "s.html"))
    out = capsys.readouterr().out
    assert rc == 1 and out.count("ERROR (exit 2)") == 2
    assert out.count("wall-clock guard") == 2


class Tables(HTMLParser):
    """Rows of each table with an id, as lists of cell texts."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.rows: dict[str, list[list[str]]] = {}
        self.table = ""
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self.table = dict(attrs).get("id") or ""
        elif tag == "tr":
            self.rows.setdefault(self.table, []).append([])
        elif tag in ("td", "th"):
            self.rows[self.table][-1].append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self.table = ""

    def handle_data(self, data: str) -> None:
        rows = self.rows.get(self.table)
        if self.table and rows and rows[-1]:
            rows[-1][-1] += data


def test_sweep_summary_holds_failures_coverage_and_speed(tmp_path: Path) -> None:
    summary = tmp_path / "summary.html"
    # Seed 9 crashes a node, seed 10 none (seed 2 does too since the
    # fail-over's crash fault).
    out = sim_cli(
        "run", "--seeds", "9..10", "--mutant", "aof-write-dropped", "--summary", str(summary)
    )
    lines = out.stdout.strip().splitlines()
    assert out.returncode == 1 and lines[-1] == "seeds: 1 passed, 1 failed", out.stdout
    assert f"summary: {summary}" in lines
    page = summary.read_text()
    tables = Tables(page).rows
    [_, failure] = tables["failures"]
    assert failure[0] == "9" and failure[1] == "FAIL" and "always-no-amnesia" in failure[2]
    assert failure[3] == "python -m sim run --seed 9 --mutant aof-write-dropped"
    assert failure[4] == "timeline"
    probes = {row[0]: row[2] for row in tables["probes"][1:]}
    assert list(probes) == list(PROBES)
    assert probes["crash"] in ("50%", "100%") and probes["wipe"] == "0%"
    [_, wall, speed] = tables["speed"]
    assert wall[0] == "wall s per seed" and len(wall) == 6
    assert speed[0] == "virtual s / wall s" and all(v.endswith("x") for v in speed[1:])
    assert sum(int(row[1]) for row in tables["histogram"][1:]) == 2


def test_quantiles_and_histogram() -> None:
    assert quantiles([]) == [] and histogram([]) == []
    assert quantiles([float(v) for v in range(1, 11)]) == [1.0, 2.0, 6.0, 10.0, 10.0]
    buckets = histogram([0.0, 1.0, 1.0, 10.0], buckets=2)
    assert [n for _, _, n in buckets] == [3, 1]
    assert histogram([2.0, 2.0], buckets=3)[0][2] == 2
