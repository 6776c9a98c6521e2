"""bench/bench_workers.py's pure parts: /proc parsing, the timed windows
read from broker polls, the tables and verdicts, --only; and the peers'
task modules, where their framework is installed (the bench extra)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "bench_workers.py"


@pytest.fixture(scope="module")
def bw() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_workers", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_workers"] = module  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


def samples(bw: ModuleType, rows: list[tuple[float, int, int]]) -> list[object]:
    """(time, jobs left, worker ticks) -> Samples, the worker one process
    (PID 7); the broker's ticks are twice the worker's, to tell them apart."""
    return [bw.Sample(t, left, {7: ticks}, 2 * ticks) for t, left, ticks in rows]


def test_stat_ticks_counts_from_the_last_parenthesis(bw: ModuleType) -> None:
    # The command name may hold spaces and a ')'. Field n holds n here, so
    # utime + stime + cutime + cstime (fields 14..17) is 14 + 15 + 16 + 17.
    line = "4242 (a) b (c)) S " + " ".join(str(n) for n in range(4, 53))
    assert bw.stat_ticks(line) == 14 + 15 + 16 + 17


def test_stat_ticks_of_this_process(bw: ModuleType) -> None:
    pid = os.getpid()
    assert pid in bw.tree_pids(pid)
    assert bw.cpu_ticks([pid, 2**22 + 1])[pid] >= 0  # no such PID: left out
    with open(f"/proc/{pid}/stat") as f:
        assert bw.stat_ticks(f.read()) >= 0


def test_children_pids_and_info_field(bw: ModuleType) -> None:
    assert bw.children_pids(["12 13 ", "", "14"]) == [12, 13, 14]
    info = "# Jobs\r\nregistered_jobs:17\r\n"
    assert bw.info_field(info, "registered_jobs") == 17
    with pytest.raises(bw.BenchError):
        bw.info_field(info, "nope")


def test_drain_window_opens_at_the_first_job_done(bw: ModuleType) -> None:
    rows = [(0.0, 100, 5), (0.1, 100, 6), (0.2, 90, 10), (1.2, 0, 60), (1.25, 0, 61)]
    rows.append((1.3, 0, 62))
    start, w = bw.drain_window(samples(bw, rows), 100, confirm=0.1)
    assert start.t == 0.2
    assert (w.jobs, w.worker_ticks, w.broker_ticks) == (90, 50, 100)
    assert w.seconds == pytest.approx(1.0)
    assert w.rate == pytest.approx(90.0)
    assert w.cpu_ms_per_1k(w.worker_ticks) == pytest.approx(50 * 1000 / bw.CLK_TCK / 0.09)


def test_drain_window_waits_for_the_confirmation(bw: ModuleType) -> None:
    rows = [(0.0, 100, 0), (0.2, 50, 0), (1.0, 0, 0), (1.05, 0, 0)]
    assert bw.drain_window(samples(bw, rows), 100, confirm=0.1) is None
    assert bw.drain_window(samples(bw, [(0.0, 100, 0)]), 100, confirm=0.1) is None


def test_a_zero_that_does_not_last_is_not_the_end(bw: ModuleType) -> None:
    # Celery pops a message before it writes it to 'unacked': a poll in
    # between sees nothing left. The end is the final run of zeros.
    rows = [(0.0, 100, 0), (0.5, 40, 0), (1.0, 0, 0), (1.1, 1, 0), (1.2, 0, 0), (1.4, 0, 0)]
    _, w = bw.drain_window(samples(bw, rows), 100, confirm=0.1)
    assert w.seconds == pytest.approx(1.2 - 0.5)


def test_steady_window_ends_after_the_last_enqueue(bw: ModuleType) -> None:
    # The worker keeps up: zeros during the run do not end it; the first
    # poll sent after the last enqueue that sees nothing left does.
    rows = [(1.0, 0, 10), (2.0, 3, 20), (3.0, 0, 30), (3.4, 0, 34), (3.6, 0, 36)]
    start = bw.Sample(0.9, 0, {7: 8}, 16)
    assert bw.steady_window(samples(bw, rows[:3]), start, 1.0, 3.2, 500, confirm=0.1) is None
    w = bw.steady_window(samples(bw, rows), start, 1.0, 3.2, 500, confirm=0.1)
    assert (w.jobs, w.worker_ticks, w.broker_ticks) == (500, 26, 52)
    assert w.seconds == pytest.approx(2.4)


def test_tree_delta_forgets_the_gone_and_counts_the_new(bw: ModuleType) -> None:
    start = {1: 100, 2: 50, 3: 7}
    end = {1: 130, 2: 60, 4: 5}  # 3 exited, 4 was born
    assert bw.tree_delta(start, end) == 30 + 10 + 5


def test_ratio_and_verdict(bw: ModuleType) -> None:
    assert bw.ratio(3.0, 2.0) == 1.5
    assert bw.ratio(3.0, None) is None
    assert bw.ratio(3.0, 0.0) is None
    assert bw.ratio(float("nan"), 1.0) is None
    assert bw.verdict(1.5, ">=", 1.5) == "PASS"
    assert bw.verdict(1.49, ">=", 1.5) == "MISS"
    assert bw.verdict(151, "<=", 150) == "MISS"
    assert bw.verdict(None, "<=", 150) == "-"


def test_markdown_table_pads_and_aligns(bw: ModuleType) -> None:
    text = bw.markdown_table(["", "rate"], [["a", "1,000"], ["longer", "5"]])
    assert text.splitlines() == [
        "|        |  rate |",
        "|--------|------:|",
        "| a      | 1,000 |",
        "| longer |     5 |",
    ]
    assert bw.fmt(None) == "-"
    assert bw.fmt(float("nan")) == "-"
    assert bw.fmt(1234.5) == "1,234"
    assert bw.fmt(1.234, ".2f", "x") == "1.23x"


def run(bw: ModuleType, peer: str, rep: int, drain: float, steady: float, cpu: float) -> object:
    def part(rate: float) -> dict[str, float]:
        return {"rate": rate, "worker_cpu_ms_per_1k": cpu, "enqueue_rate": 1.0}

    return bw.RunResult(peer, rep, part(drain), part(steady))


def test_report_takes_medians_and_checks_the_targets(bw: ModuleType) -> None:
    results = [
        run(bw, "disque", 1, 3000, 2000, 100),
        run(bw, "disque", 2, 9000, 2400, 200),
        run(bw, "disque", 3, 3300, 2200, 120),
        run(bw, "dramatiq-50", 1, 2000, 2000, 300),
        run(bw, "celery", 1, 1000, 1000, 900),
        bw.RunResult("celery", 2, None, None, "boom"),
    ]
    peers = {p.name: p for p in bw.PEERS}
    summaries = [bw.Summary.of(peers[n], results) for n in ("disque", "dramatiq-50", "celery")]
    ours = summaries[0]
    assert (ours.drain, ours.steady, ours.cpu_drain, ours.runs) == (3300, 2200, 120, 3)
    assert summaries[2].runs == 1
    figures, ratios, cpu = bw.report(summaries).split("\n\n")
    cells = [c.strip() for c in figures.splitlines()[2].split("|")]
    assert cells[2:6] == ["3,300", "2,200", "120", "120"]
    dramatiq, celery = ratios.splitlines()[2:]
    assert "1.65x" in dramatiq and "1.10x" in dramatiq and "PASS / MISS" in dramatiq
    assert "3.30x" in celery and "2.20x" in celery and "PASS / PASS" in celery
    assert "<= 150 |    PASS / PASS |" in cpu


def test_only_takes_names_and_prefixes(bw: ModuleType) -> None:
    names = [p.name for p in bw.select_peers(["dramatiq,arq"])]
    assert names == ["dramatiq-50", "dramatiq-8", "arq"]
    assert [p.name for p in bw.select_peers(["disque-w"])] == ["disque-warning"]
    assert len(bw.select_peers(None)) == len(bw.PEERS)
    with pytest.raises(SystemExit):
        bw.select_peers(["nope"])


def test_parse_args_quick_and_defaults(bw: ModuleType) -> None:
    args = bw.parse_args(["--quick"])
    assert (args.jobs, args.repeat) == (2000, 1)
    args = bw.parse_args([])
    assert (args.jobs, args.repeat) == (20_000, 3)


@pytest.fixture
def peers_path() -> object:
    sys.path.insert(0, str(ROOT / "bench"))
    yield
    sys.path.remove(str(ROOT / "bench"))
    for name in [m for m in sys.modules if m.startswith("worker_peers")]:
        del sys.modules[name]


@pytest.mark.usefixtures("peers_path")
def test_the_disque_trio_task_uses_the_public_worker_surface() -> None:
    from disque_trio.worker import Worker

    app = importlib.import_module("worker_peers.disque_trio_app")
    assert isinstance(app.worker, Worker)
    assert callable(app.noop)


@pytest.mark.usefixtures("peers_path")
@pytest.mark.parametrize("framework", ["dramatiq", "celery"])
def test_the_peer_tasks_import_without_a_broker(framework: str) -> None:
    pytest.importorskip(framework, reason="the bench extra is not installed")
    app = importlib.import_module(f"worker_peers.{framework}_app")
    assert callable(app.open_producer())
