"""Console entry point: ``disque-trio [CONFIG_FILE] [--directive value ...]``.

Like ``disque-server``: an optional config file first, then any directive as a
``--flag``. Exit status 0 after a clean shutdown (SIGINT, SIGTERM, SHUTDOWN),
1 with a one-line reason on a bad configuration, a port in use or a
cluster-config-file another running node holds.
"""

from __future__ import annotations

import base64
import errno
import gc
import json
import logging
import os
import resource
import signal
import socket
import sys
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import trio
import trio_websocket

from . import checkaof
from .about import OPERATOR_FILES, commit, operator_file
from .config import CLUSTER_PORT_OFFSET, Config, ConfigError, parse_argv
from .env import Env, LockedError, real_env
from .server.aof import AofLoadError
from .server.logs import LineFormatter, set_log_level
from .server.node import ListenError, NodeServer
from .server.tls import TlsContexts
from .server.version import PACKAGE_VERSION, VERSION

USAGE = """\
Usage: disque-trio [/path/to/disque.conf] [--directive value ...]
       disque-trio check-aof [--fix [--yes]] FILE
       disque-trio ws [--auth PASSWORD] URL COMMAND [ARG ...]
       disque-trio worker MODULE:ATTRIBUTE [--nodes URL] [options]   (--help for them)
       disque-trio cluster create HOST:PORT HOST:PORT [...] [--password P]
       disque-trio cluster status HOST:PORT [--password P]
       disque-trio sample-config | sample-unit | sample-alerts
       disque-trio --version
       disque-trio --help

Examples:
       disque-trio                                  (defaults: 127.0.0.1:7711, in memory)
       disque-trio /etc/disque/disque.conf
       disque-trio --port 7777 --bind 127.0.0.1 --dir ./data --loglevel notice
       disque-trio /etc/disque.conf --loglevel verbose
       disque-trio ws ws://127.0.0.1:8711/ws QSTAT myqueue
       disque-trio worker myapp.tasks:worker --nodes disque://127.0.0.1:7711
       disque-trio cluster create 127.0.0.1:7711 127.0.0.1:7712 127.0.0.1:7713
       disque-trio sample-config > /etc/disque-trio/7711.conf

The sample commands print the operator's files this release ships: a
commented configuration, a systemd unit (disque-trio@.service) and
Prometheus alert rules.
"""
WS_USAGE = "Usage: disque-trio ws [--auth PASSWORD] URL COMMAND [ARG ...]"
WS_CONNECT_TIMEOUT_S = 10.0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0
    if args and args[0] == "check-aof":
        return check_aof(args[1:])
    if args and args[0] == "ws":
        return ws_command(args[1:])
    if args and args[0] == "cluster":
        from .clusterctl import main as cluster_main  # the node does not need it

        return cluster_main(args[1:])
    if args and args[0] == "worker":
        from .worker import main as worker_main  # the node does not need it

        return worker_main(args[1:])
    if args and args[0] in ("-v", "--version"):
        print(
            f"disque-trio {PACKAGE_VERSION} (commit {commit()[:12]}, Disque {VERSION} compatible)"
        )
        return 0
    if args and args[0].startswith("sample-") and args[0][len("sample-") :] in OPERATOR_FILES:
        return sample_file(args[0][len("sample-") :], args[1:])
    try:
        path, overrides = parse_argv(args)
        config = Config.load(path, overrides)
        _enter_dir(config)
        _setup_logging(config)
        # Certificates and keys are read now (relative paths from `dir`),
        # so that a bad one is a configuration error, before any port.
        tls = TlsContexts.from_config(config)
    except ConfigError as e:
        print(f"*** FATAL CONFIG ERROR *** {e}", file=sys.stderr)
        return 1
    log = logging.getLogger("disque_trio")
    env = real_env()
    if not _claim_cluster_config(env, config, log):
        return 1
    _tune_gc()
    for name in config.ignored_settings():
        log.warning("directive '%s' is accepted but has no effect", name)
    _fit_open_files_limit(config, log)
    pidfile = PidFile(config.pidfile) if config.pidfile else None
    try:
        trio.run(_serve, config, env, pidfile, tls)
    except (AofLoadError, ConfigError) as e:
        log.error("%s", e)
        return 1
    except OSError as e:
        log.error("Could not start: %s", _describe_os_error(e, config))
        return 1
    except KeyboardInterrupt:
        pass
    finally:
        if pidfile is not None:
            pidfile.remove()
    return 0


def sample_file(kind: str, args: list[str]) -> int:
    """``disque-trio sample-config`` (and -unit, -alerts): print one of the
    operator's files, as this release ships it, to standard output."""
    if args:
        print(f"Usage: disque-trio sample-{kind}  (prints to standard output)", file=sys.stderr)
        return 2
    try:
        text = operator_file(kind)
    except OSError as e:
        print(f"{OPERATOR_FILES[kind]} is not in this install: {e}", file=sys.stderr)
        return 1
    sys.stdout.write(text)
    return 0


def _claim_cluster_config(env: Env, config: Config, log: logging.Logger) -> bool:
    """One node per cluster-config-file, as in Redis: lock it for the life
    of the process before the node reads or writes it and before any port
    is bound. Two nodes started in one directory would otherwise share one
    identity, the second overwriting the first's nodes.conf. False (and
    the reason logged) when another node holds it; a file that cannot be
    locked at all (an unwritable directory, where nodes.conf cannot be
    saved either) is only a warning, as a failed save is."""
    path = config.cluster_config_file  # relative to `dir`, the working directory now
    try:
        env.disk.lock(path)
    except LockedError as e:
        log.error("Could not start: %s; give each node its own dir or cluster-config-file", e)
        return False
    except OSError as e:
        log.warning(
            "could not lock %s (%s): a second node started on it would not be refused",
            os.path.abspath(path),
            e.strerror or e,
        )
    return True


# Descriptors a node needs besides its clients: listening sockets, the AOF,
# the log, nodes.conf and temporary files (32, Redis' reserve), and the bus:
# 64 inbound links waiting for a handshake or MEET (server/peers.py) and an
# inbound and an outbound link for each of up to 32 peers.
RESERVED_FDS = 32 + 64 + 2 * 32


def _fit_open_files_limit(config: Config, log: logging.Logger) -> None:
    """Like the original: raise the open files limit (up to the hard limit)
    to what maxclients needs, and if that is not allowed, lower maxclients
    to what the limit allows, saying so. Past it, accept() would fail with
    EMFILE (the accept loops then wait and retry, but clients would hang)."""
    wanted = config.maxclients + RESERVED_FDS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    except (OSError, ValueError) as e:
        log.warning("could not raise the open files limit to %d: %s", target, e)
    if soft >= wanted:
        log.info("open files limit raised to %d (maxclients %d)", soft, config.maxclients)
        return
    fitted = max(1, soft - RESERVED_FDS)
    log.warning(
        "maxclients lowered from %d to %d: the open files limit (ulimit -n) is %d; "
        "raise it to %d for %d clients",
        config.maxclients,
        fitted,
        soft,
        wanted,
        config.maxclients,
    )
    config.config_set("maxclients", str(fitted))


class PidFile:
    """``pidfile``: the process ID, written once the ports are bound and
    removed at a clean exit. Best effort, as in the original: a path that
    cannot be written is a warning, not a reason to stay down (the
    original's example configuration names /var/run/disque.pid)."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)  # relative to `dir`, the working directory
        self.written = False

    def write(self) -> None:
        try:
            with open(self.path, "w", encoding="ascii") as f:
                f.write(f"{os.getpid()}\n")
        except OSError as e:
            logging.getLogger("disque_trio").warning(
                "Could not write the pid file %s: %s", self.path, e.strerror or e
            )
            return
        self.written = True

    def remove(self) -> None:
        """Remove the file if it is still ours (another node may have taken
        the path since)."""
        if not self.written:
            return
        self.written = False
        try:
            with open(self.path, encoding="ascii") as f:
                if f.read().strip() != str(os.getpid()):
                    return
            os.unlink(self.path)
        except (OSError, ValueError):
            return
        logging.getLogger("disque_trio").info("Removed the pid file %s", self.path)


def check_aof(args: list[str]) -> int:
    """``disque-trio check-aof [--fix [--yes]] FILE``: see checkaof.py."""
    return checkaof.main(args)


def ws_command(args: list[str]) -> int:
    """``disque-trio ws [--auth PW] URL CMD [ARG...]``: run one command over
    the WebSocket JSON protocol and print its result: a string as text (INFO
    reads as it does in redis-cli), anything else as JSON. Exit 1 with one
    line on an error reply or when the node cannot be reached, 2 on usage."""
    password = None
    if args[:1] == ["--auth"] and len(args) >= 2:
        password, args = args[1], args[2:]
    if len(args) < 2:
        print(WS_USAGE, file=sys.stderr)
        return 2
    url, cmd = args[0], args[1:]
    problem = _ws_url_problem(url)
    if problem is not None:
        print(problem, file=sys.stderr)
        return 2
    try:
        reply = trio.run(_ws_call, url, cmd, password)
    except Exception as e:
        print(_ws_failure(url, e), file=sys.stderr)
        return 1
    if "error" in reply:
        print(reply["error"], file=sys.stderr)
        return 1
    result = reply.get("result")
    if isinstance(result, str):
        text = result.replace("\r\n", "\n")
        print(text, end="" if text.endswith("\n") else "\n")
    else:
        print(json.dumps(result, ensure_ascii=False, indent=2))
    return 0


def _ws_url_problem(url: str) -> str | None:
    """Why the URL cannot be a node's WebSocket, or None."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError on a bad port)
    except ValueError as e:
        return f"Bad URL {url}: {e}"
    if parts.scheme not in ("ws", "wss"):
        scheme = {"http": "ws", "https": "wss"}.get(parts.scheme)
        hint = ""
        if scheme is not None:
            path = parts.path if parts.path not in ("", "/") else "/ws"
            hint = f" (did you mean {urlunsplit((scheme, parts.netloc, path, '', ''))}?)"
        return f"URL must start with ws:// or wss://{hint}"
    if not parts.hostname:
        return f"Bad URL {url}: no host"
    return None


def _ws_failure(url: str, e: BaseException) -> str:
    """One line for a WebSocket call that failed before a reply came."""
    parts = urlsplit(url)
    where = f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'wss' else 80)}"
    if isinstance(e, trio_websocket.ConnectionRejected):
        status = e.status_code
        if status == 404 or (status is not None and 200 <= status < 300):
            hint = " (try /ws)" if parts.path != "/ws" else ""
            return f"HTTP {status} from {url}: not a WebSocket endpoint{hint}"
        return f"HTTP {status} from {url}: WebSocket handshake refused{_short_body(e.body)}"
    if isinstance(e, trio_websocket.ConnectionTimeout):
        return (
            f"No WebSocket handshake from {where} within {WS_CONNECT_TIMEOUT_S:g} s "
            "(is it the web port? by default the client port + 1000)"
        )
    if isinstance(e, trio_websocket.ConnectionClosed):
        code = getattr(e.reason, "code", None)
        why = " ".join(str(x) for x in (code, getattr(e.reason, "reason", None)) if x)
        return f"The node closed the connection to {url}" + (f" ({why})" if why else "")
    if isinstance(e, trio_websocket.HandshakeError | OSError):
        return f"Could not connect to {where}: {_connect_failure(e)}"
    if isinstance(e, json.JSONDecodeError):
        return f"{url} answered with something that is not JSON: is it a disque-trio node?"
    return f"Could not talk to {url}: {type(e).__name__}: {e}"


def _connect_failure(e: BaseException) -> str:
    """The reason under a failed connection attempt, in a few words
    (trio wraps it in an OSError around an exception group)."""
    todo: list[BaseException] = [e]
    seen: set[int] = set()
    while todo:
        x = todo.pop(0)
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, socket.gaierror):
            return f"unknown host ({x.strerror})"
        if isinstance(x, OSError) and x.errno:
            return os.strerror(x.errno).lower()
        if isinstance(x, BaseExceptionGroup):
            todo.extend(x.exceptions)
        todo.extend(c for c in (x.__cause__, x.__context__) if c is not None)
    return str(e) or type(e).__name__


def _short_body(body: bytes | None) -> str:
    """A plain-text error body worth quoting: one short line."""
    text = (body or b"").decode("utf-8", "replace").strip()
    if not text or "\n" in text or len(text) > 100 or text.startswith("<"):
        return ""
    return f": {text}"


async def _ws_call(url: str, cmd: list[str], password: str | None) -> dict[str, Any]:
    async with trio_websocket.open_websocket_url(url, connect_timeout=WS_CONNECT_TIMEOUT_S) as ws:
        if password is not None:
            auth = await _ws_request(ws, ["AUTH", password])
            if "error" in auth:
                return auth
        return await _ws_request(ws, cmd)


async def _ws_request(ws: trio_websocket.WebSocketConnection, cmd: list[str]) -> dict[str, Any]:
    args = [_ws_arg(a) for a in cmd]
    await ws.send_message(json.dumps({"id": 1, "cmd": args}))
    reply: dict[str, Any] = json.loads(await ws.get_message())
    return reply


def _ws_arg(arg: str) -> str | dict[str, str]:
    """A command-line argument; bytes that are not text go as base64."""
    try:
        arg.encode("utf-8")
    except UnicodeEncodeError:
        raw = arg.encode("utf-8", "surrogateescape")
        return {"base64": base64.b64encode(raw).decode("ascii")}
    return arg


def _tune_gc() -> None:
    """A node keeps millions of long-lived objects (jobs): with CPython's
    default thresholds the cycle collector runs every 700 allocations and
    re-scans them often. Jobs form no cycles, so collect less often, and move
    everything allocated at start-up out of the collector's sight. PyPy's
    collector has neither knob (nor this problem): nothing to do there."""
    if sys.implementation.name != "cpython":
        return
    gc.set_threshold(50_000, 20, 10)
    gc.freeze()


def _enter_dir(config: Config) -> None:
    # Like the original: relative paths (logfile, AOF, nodes.conf) are
    # relative to `dir`, which becomes the working directory.
    try:
        os.makedirs(config.dir, exist_ok=True)
        os.chdir(config.dir)
    except OSError as e:
        raise ConfigError(f"Can't chdir to '{config.dir}': {e.strerror}") from None


def _setup_logging(config: Config) -> None:
    handler: logging.Handler
    if config.logfile:
        # Opened now, like the original: a log file that cannot be written
        # is a configuration error, not a traceback.
        try:
            handler = logging.FileHandler(config.logfile)
        except OSError as e:
            raise ConfigError(
                f"Can't open the log file '{config.logfile}': {e.strerror or e}"
            ) from None
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LineFormatter())
    root = logging.getLogger("disque_trio")
    root.handlers[:] = [handler]
    root.propagate = False
    set_log_level(config.loglevel)


def _describe_os_error(e: OSError, config: Config) -> str:
    """One line: which port could not be bound, why, and what moves it."""
    if not isinstance(e, ListenError):
        return str(e)
    if e.role == "web":
        what = f"web port {e.port}"
        fix = "set web-port to change it, or web-port 0 to turn the web listener off"
    elif e.role == "tls":
        what = f"TLS port {e.port}"
        fix = "set tls-port to change it"
    elif e.role == "bus":
        base = "port" if config.port else "tls-port"
        derived = "" if config.cluster_port else f" ({base} + {CLUSTER_PORT_OFFSET})"
        what = f"cluster bus port {e.port}{derived}"
        fix = "set cluster-port to change it"
    else:
        what = f"port {e.port}"
        fix = "set port to change it"
    if e.errno == errno.EADDRINUSE:
        return f"{what} is already in use on {e.host} ({fix})"
    if e.errno == errno.EADDRNOTAVAIL:
        return f"cannot listen on {e.host}, {what}: address not available here (check bind)"
    if isinstance(e.cause, socket.gaierror):
        return f"cannot listen on {e.host}, {what}: unknown address (check bind)"
    reason = (e.strerror or str(e.cause)).lower()
    return f"cannot listen on {e.host}, {what}: {reason} ({fix})"


async def _serve(
    config: Config, env: Env, pidfile: PidFile | None = None, tls: TlsContexts | None = None
) -> None:
    server = NodeServer(config, env, tls_contexts=tls)
    # Load and bind before the nursery exists, so that a bad AOF or a port
    # in use surfaces as itself (main() turns it into one line), not wrapped.
    server.load()
    bound = await server.bind()
    if pidfile is not None:
        pidfile.write()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_watch_signals, server)
        await nursery.start(server.run, bound.client, bound.bus, bound.web, bound.tls)
        await server.finished.wait()
        nursery.cancel_scope.cancel()


async def _watch_signals(server: NodeServer) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            logging.getLogger("disque_trio").warning(
                "Received %s scheduling shutdown...", signal.Signals(signum).name
            )
            server.shutdown()
            return


if __name__ == "__main__":
    raise SystemExit(main())
