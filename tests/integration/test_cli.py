"""The ``disque-trio`` command: start-up, configuration errors, signals."""

from __future__ import annotations

import logging
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import redis
import trio_websocket
from trio_websocket import CloseReason

from disque_trio import cli
from disque_trio.server.logs import VERBOSE, level_mark

from ..helpers import free_port
from .conftest import NodeProcess


def run_cli(*args: str, cwd: Path, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "disque_trio", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_shuts_down_cleanly(node_factory: object, sig: int) -> None:
    node: NodeProcess = node_factory()  # type: ignore[operator]
    blocked = redis.Redis(port=node.port, socket_timeout=10)
    blocked.ping()
    assert node.kill(sig) == 0
    out = node.output()
    assert "ready to accept connections" in out and "bye bye" in out


def test_logs_where_it_listens(node: NodeProcess) -> None:
    assert node.kill(signal.SIGTERM) == 0
    assert f"127.0.0.1:{node.port}" in node.output()


LOG_LINE = re.compile(r"\d+:M \d\d [A-Z][a-z]{2} \d\d:\d\d:\d\d\.\d{3} ([.*#-]) (.*)")


def log_lines(out: str) -> list[tuple[str, str]]:
    """(level mark, message) of every line; each must be a log line."""
    lines = []
    for line in out.splitlines():
        m = LOG_LINE.fullmatch(line)
        assert m, f"not a log line: {line!r}"
        lines.append((m.group(1), m.group(2)))
    return lines


def ping_from(port: int) -> int:
    """PING over a fresh connection; the connection's local port."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"PING\r\n")
        assert s.recv(64) == b"+PONG\r\n"
        return int(s.getsockname()[1])


def test_log_lines_carry_the_originals_level_marks(node_factory: object) -> None:
    node: NodeProcess = node_factory("--loglevel", "verbose")  # type: ignore[operator]
    seen = ping_from(node.port)
    redis.Redis(port=node.port, socket_timeout=10).config_set("loglevel", "warning")
    unseen = ping_from(node.port)  # verbose lines are off now
    assert node.kill(signal.SIGTERM) == 0
    lines = log_lines(node.output())
    marks = {message: mark for mark, message in lines}
    assert any(m == "*" and "ready to accept connections" in t for m, t in lines)
    assert marks[f"Accepted 127.0.0.1:{seen}"] == "-"
    assert marks[f"Connection from 127.0.0.1:{seen} closed"] == "-"
    assert not any(str(unseen) in t for _, t in lines)
    assert marks["Disque is now ready to exit, bye bye..."] == "#"
    assert marks["Received SIGTERM scheduling shutdown..."] == "#"


def test_python_levels_map_onto_the_originals_four() -> None:
    marks = [level_mark(n) for n in (logging.DEBUG, VERBOSE, logging.INFO, logging.WARNING)]
    assert marks == [".", "-", "*", "#"]
    assert level_mark(logging.ERROR) == level_mark(logging.CRITICAL) == "#"


def test_loglevel_warning_prints_warnings_only(node_factory: object) -> None:
    node: NodeProcess = node_factory("--loglevel", "warning")  # type: ignore[operator]
    redis.Redis(port=node.port, socket_timeout=10).ping()
    assert node.kill(signal.SIGINT) == 0
    lines = log_lines(node.output())
    assert lines and {mark for mark, _ in lines} == {"#"}, lines
    assert ("#", "Disque is now ready to exit, bye bye...") in lines


def test_gc_tuning_only_on_cpython(monkeypatch: pytest.MonkeyPatch) -> None:
    """PyPy's gc module has neither set_threshold nor freeze: the node must
    start there without touching them."""
    import gc
    import types

    calls: list[str] = []
    monkeypatch.setattr(gc, "set_threshold", lambda *a: calls.append("set_threshold"))
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr(cli.sys, "implementation", types.SimpleNamespace(name="pypy"))
    cli._tune_gc()
    assert calls == []
    monkeypatch.setattr(cli.sys, "implementation", types.SimpleNamespace(name="cpython"))
    cli._tune_gc()
    assert calls == ["set_threshold", "freeze"]


def test_unknown_directive_names_file_and_line(tmp_path: Path) -> None:
    conf = tmp_path / "disque.conf"
    conf.write_text("# a comment\nport 7711\nbogus-directive yes\n")
    result = run_cli(str(conf), cwd=tmp_path)
    assert result.returncode == 1
    assert str(conf) in result.stderr and "line 3" in result.stderr
    assert "bogus-directive" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_bad_value_on_command_line(tmp_path: Path) -> None:
    result = run_cli("--port", "notaport", cwd=tmp_path)
    assert result.returncode == 1 and "port" in result.stderr


def test_port_in_use(node: NodeProcess, tmp_path: Path) -> None:
    result = run_cli("--port", str(node.port), cwd=tmp_path)
    assert result.returncode == 1
    assert "already in use" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single line a failed start-up prints (no traceback)."""
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("taken", "extra", "expected"),
    [
        (0, [], "port {p} is already in use on 127.0.0.1 (set port to change it)"),
        (
            10000,
            [],
            "cluster bus port {p} (port + 10000) is already in use on 127.0.0.1 "
            "(set cluster-port to change it)",
        ),
        (1000, [], "web port {p} is already in use on 127.0.0.1 (set web-port"),
        (
            None,
            ["--cluster-port", "{p}"],
            "cluster bus port {p} is already in use on 127.0.0.1 (set cluster-port",
        ),
    ],
    ids=["client", "bus", "web", "cluster-port"],
)
def test_a_taken_port_is_named_with_its_directive(
    tmp_path: Path, taken: int | None, extra: list[str], expected: str
) -> None:
    port = free_port()
    busy = free_port() if taken is None else port + taken  # None: a port of its own
    with socket.socket() as s:
        s.bind(("127.0.0.1", busy))
        s.listen()
        args = [a.format(p=busy) for a in extra]
        result = run_cli("--port", str(port), "--bind", "127.0.0.1", *args, cwd=tmp_path)
    line = one_error_line(result)
    assert "Could not start: " + expected.format(p=busy) in line
    # The message names the port that is taken, not the client port.
    if taken:
        assert f" {port} " not in line


def test_logfile_in_a_missing_directory_is_a_config_error(tmp_path: Path) -> None:
    logfile = tmp_path / "no-such-dir" / "disque.log"
    line = one_error_line(
        run_cli("--port", str(free_port()), "--logfile", str(logfile), cwd=tmp_path)
    )
    assert line.startswith("*** FATAL CONFIG ERROR *** Can't open the log file")
    assert str(logfile) in line and "No such file or directory" in line


def test_logfile_receives_the_log(node_factory: object, tmp_path: Path) -> None:
    node: NodeProcess = node_factory("--logfile", "node.log")  # type: ignore[operator]
    assert node.kill(signal.SIGTERM) == 0
    text = (node.workdir / "node.log").read_text()  # relative to dir
    assert "ready to accept connections" in text and "bye bye" in text


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "SHUTDOWN"])
def test_pidfile_is_written_and_removed_at_a_clean_exit(
    node_factory: object, tmp_path: Path, how: str
) -> None:
    pidfile = tmp_path / "run" / "disque.pid"
    pidfile.parent.mkdir()
    node: NodeProcess = node_factory("--pidfile", str(pidfile))  # type: ignore[operator]
    assert node.proc is not None
    assert pidfile.read_text() == f"{node.proc.pid}\n"
    if how == "SHUTDOWN":
        redis.Redis(port=node.port, socket_timeout=10).shutdown()  # raises if it answers
        assert node.proc.wait(timeout=15) == 0
    else:
        assert node.kill(getattr(signal, how)) == 0
    assert not pidfile.exists()
    assert "Removed the pid file" in node.output()


def test_pidfile_from_a_config_file_is_relative_to_dir(tmp_path: Path) -> None:
    port = free_port()
    conf = tmp_path / "disque.conf"
    conf.write_text(f"port {port}\nbind 127.0.0.1\ndir data\npidfile node.pid\n")
    node = NodeProcess(port, tmp_path, [str(conf)])
    try:
        node.start()
        assert node.proc is not None
        assert (tmp_path / "data" / "node.pid").read_text() == f"{node.proc.pid}\n"
        assert node.kill(signal.SIGTERM) == 0
        assert not (tmp_path / "data" / "node.pid").exists()
    finally:
        node.stop()


def test_an_unwritable_pidfile_is_one_warning(node_factory: object, tmp_path: Path) -> None:
    pidfile = tmp_path / "no-such-dir" / "disque.pid"
    node: NodeProcess = node_factory("--pidfile", str(pidfile))  # type: ignore[operator]
    assert redis.Redis(port=node.port, socket_timeout=10).ping()
    assert node.kill(signal.SIGTERM) == 0
    about_it = [(m, t) for m, t in log_lines(node.output()) if "pid file" in t]
    assert about_it == [
        ("#", f"Could not write the pid file {pidfile}: No such file or directory")
    ]


def test_a_second_node_in_the_same_dir_is_refused(node: NodeProcess) -> None:
    """Issue 57: two nodes started in one directory shared one identity,
    the second overwriting the first's nodes.conf. The second now refuses
    to start, before it reads or writes nodes.conf or binds a port."""
    assert node.proc is not None
    conf = node.workdir / "nodes.conf"
    before = conf.read_bytes()
    my_id = redis.Redis(port=node.port, socket_timeout=10).execute_command("CLUSTER", "MYID")
    port = free_port()
    result = run_cli("--port", str(port), "--bind", "127.0.0.1", cwd=node.workdir, timeout=10)
    line = one_error_line(result)
    assert line.endswith(
        f"# Could not start: {conf} is in use by another disque-trio node "
        f"(pid {node.proc.pid}); give each node its own dir or cluster-config-file"
    )
    assert conf.read_bytes() == before
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    assert ping_from(node.port)
    # The kernel releases the lock of a killed node: it restarts in its
    # dir with its identity.
    assert node.kill(signal.SIGKILL) == -signal.SIGKILL
    node.start()
    assert redis.Redis(port=node.port, socket_timeout=10).execute_command("CLUSTER", "MYID") == (
        my_id
    )


def test_a_cluster_config_file_that_cannot_be_locked_is_a_warning(
    node_factory: object,
) -> None:
    """Where the lock file cannot be made, nodes.conf cannot be saved
    either; as that failed save, it is a warning, and the node runs."""
    node: NodeProcess = node_factory("--cluster-config-file", "missing/nodes.conf")  # type: ignore[operator]
    assert node.kill(signal.SIGTERM) == 0
    warnings = [t for m, t in log_lines(node.output()) if m == "#" and "lock" in t]
    assert warnings == [
        f"could not lock {node.workdir / 'missing/nodes.conf'} (No such file or directory): "
        "a second node started on it would not be refused"
    ]


def test_a_directive_without_dashes_suggests_the_flag(tmp_path: Path) -> None:
    line = one_error_line(run_cli("port", "7716", cwd=tmp_path))
    assert line.startswith("*** FATAL CONFIG ERROR ***")
    assert "did you mean '--port 7716'?" in line


def test_a_missing_config_file_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "missing.conf"
    line = one_error_line(run_cli(str(missing), cwd=tmp_path))
    assert line == (
        f"*** FATAL CONFIG ERROR *** Can't open config file '{missing}': No such file or directory"
    )


def test_corrupted_nodes_conf_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "nodes.conf").write_text("garbage line\n")
    line = one_error_line(run_cli("--port", str(free_port()), "--bind", "127.0.0.1", cwd=tmp_path))
    assert "corrupted cluster config file nodes.conf" in line


ROOT = Path(__file__).resolve().parents[2]


def test_files_a_node_writes_in_a_checkout_are_ignored(node_factory: object) -> None:
    """Run from a checkout with the default `dir`, a node writes into it:
    `git status` must stay clean."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    node: NodeProcess = node_factory("--appendonly", "yes")  # type: ignore[operator]
    r = redis.Redis(port=node.port, socket_timeout=10)
    r.execute_command("ADDJOB", "q", "body", 0)
    r.execute_command("BGREWRITEAOF")
    r.shutdown()
    assert node.proc is not None and node.proc.wait(timeout=15) == 0
    # (node-output.log is the test harness's: the node's stdout.)
    written = sorted(p.name for p in node.workdir.iterdir() if p != node.log_path)
    assert written == ["disque.aof", "nodes.conf", "nodes.conf.lock"]
    # Also the names of temporary files and of check-aof's backups.
    names = [*written, "nodes.conf.tmp-123", "disque.aof.tmp-123", "disque.aof.bak"]
    names += ["disque.aof.bak.2", ".disque.aof.check-aof-123.tmp", ".disque-conf-x1.tmp"]
    names += [f"somewhere/{name}" for name in names]
    result = subprocess.run(
        ["git", "check-ignore", "--no-index", "--verbose", "--non-matching", *names],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    not_ignored = [line for line in result.stdout.splitlines() if line.startswith("::")]
    assert result.returncode == 0 and not not_ignored, result.stdout + result.stderr


def test_config_file_and_rewrite(tmp_path: Path, node_factory: object) -> None:
    port = free_port()
    conf = tmp_path / "disque.conf"
    conf.write_text(f"# my node\nport {port}\n\n# memory\nmaxmemory 1gb\n")
    node = NodeProcess(port, tmp_path, [str(conf)])
    try:
        node.start()
        r = redis.Redis(port=port, socket_timeout=10)
        assert r.config_get("port") == {"port": str(port)} or r.config_get("port") == {
            b"port": str(port).encode()
        }
        r.config_set("maxmemory", "2gb")
        r.config_set("loglevel", "verbose")
        r.execute_command("CONFIG", "REWRITE")
        text = conf.read_text()
        assert text.startswith("# my node\n")
        assert "maxmemory 2gb" in text and "loglevel verbose" in text
        with pytest.raises(redis.ResponseError, match="Unsupported CONFIG parameter"):
            r.config_set("port", "1234")
    finally:
        node.stop()


def test_version_and_help(tmp_path: Path) -> None:
    from disque_trio import __version__
    from disque_trio.about import commit

    version = run_cli("--version", cwd=tmp_path).stdout
    assert version == (
        f"disque-trio {__version__} (commit {commit()[:12]}, Disque 1.0-rc1 compatible)\n"
    )
    assert "Usage" in run_cli("--help", cwd=tmp_path).stdout


@pytest.mark.parametrize(
    "kind,name",
    [
        ("config", "disque.conf"),
        ("unit", "disque-trio.service"),
        ("alerts", "prometheus-alerts.yml"),
    ],
)
def test_sample_files_print_the_operator_files(tmp_path: Path, kind: str, name: str) -> None:
    done = run_cli(f"sample-{kind}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (ROOT / "docs" / name).read_text()
    extra = run_cli(f"sample-{kind}", "out.conf", cwd=tmp_path)
    assert extra.returncode == 2 and "prints to standard output" in extra.stderr
    assert not (tmp_path / "out.conf").exists()


def test_ws_failure_lines() -> None:
    url = "ws://127.0.0.1:7711/ws"
    timeout = cli._ws_failure(url, trio_websocket.ConnectionTimeout())
    assert timeout.startswith("No WebSocket handshake from 127.0.0.1:7711 within 10 s")
    assert "client port + 1000" in timeout
    unknown = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    wrapped = trio_websocket.HandshakeError()
    wrapped.__cause__ = OSError("all attempts to connect failed")
    wrapped.__cause__.__cause__ = ExceptionGroup("all attempts", [unknown])
    assert cli._ws_failure("ws://nowhere.invalid/ws", wrapped) == (
        "Could not connect to nowhere.invalid:80: unknown host (Name or service not known)"
    )
    closed = trio_websocket.ConnectionClosed(CloseReason(1009, "message too big"))
    assert cli._ws_failure(url, closed) == (
        f"The node closed the connection to {url} (1009 message too big)"
    )
    assert cli._ws_url_problem("wss://h:1/ws") is None
    assert cli._ws_url_problem("https://h/") == (
        "URL must start with ws:// or wss:// (did you mean wss://h/ws?)"
    )
    assert cli._ws_url_problem("h:8711/ws") == "URL must start with ws:// or wss://"
