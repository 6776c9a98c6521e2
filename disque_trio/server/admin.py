"""Server commands the shell answers: connection, introspection, control.

PING, TIME, AUTH, HELLO, QUIT, INFO, COMMAND, CLIENT, CONFIG, DEBUG, MONITOR,
SLOWLOG, LATENCY, SHUTDOWN. The job and queue commands live in the core;
these need the server's view (clients, configuration, process).
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Callable
from typing import Any

from ..config import PROTECTED, ConfigError
from ..core.args import option, parse_int, text
from ..core.commands import Command
from ..protocol.replies import (
    OK,
    SYNTAX_ERROR,
    Push,
    Reply,
    ReplyError,
    Status,
    Verbatim,
    err,
)
from . import clustercmds, info
from .client import Client
from .host import Context, ServerHost
from .version import VERSION

ShellHandler = Callable[[Context, list[bytes]], Reply]


def ping(ctx: Context, argv: list[bytes]) -> Reply:
    """PING [message]"""
    if len(argv) > 2:
        return err("wrong number of arguments for 'ping' command")
    sub = ctx.client.pubsub
    if sub is not None and sub.count() and ctx.client.proto < 3:
        # A RESP2 subscriber: the answer is a message (Redis' shape).
        return Push(("pong", argv[1] if len(argv) == 2 else b""))
    return argv[1] if len(argv) == 2 else Status("PONG")


def time_(ctx: Context, argv: list[bytes]) -> Reply:
    """TIME: [unix seconds, microseconds] as bulk strings."""
    ms = ctx.server.env.clock.wall_ms()
    return [str(ms // 1000), str((ms % 1000) * 1000)]


def quit_(ctx: Context, argv: list[bytes]) -> Reply:
    ctx.client.close_after_reply = True
    return OK


def auth(ctx: Context, argv: list[bytes]) -> Reply:
    """AUTH password"""
    return _check_password(ctx, argv[1])


def _check_password(ctx: Context, password: bytes) -> Reply:
    expected = ctx.server.config.requirepass
    if not expected:
        return err("Client sent AUTH, but no password is set")
    # Constant time, like the web port's check (server/web.py).
    if not hmac.compare_digest(password, expected.encode("utf-8", "surrogateescape")):
        ctx.client.authenticated = False
        return err("invalid password")
    ctx.client.authenticated = True
    return OK


def hello(ctx: Context, argv: list[bytes]) -> Reply:
    """HELLO: Disque's node list. HELLO protover [AUTH user pass] [SETNAME n]:
    Redis' handshake (redis-py 8 opens every connection with HELLO 3)."""
    if len(argv) == 1:
        if not ctx.client.authenticated:
            raise ReplyError("NOAUTH", "Authentication required.")
        return disque_hello(ctx.server)
    try:
        proto = parse_int(argv[1])
    except ReplyError:
        return err("Protocol version is not an integer or out of range")
    if proto not in (2, 3):
        return ReplyError("NOPROTO", "unsupported protocol version")
    i, name = 2, None
    while i < len(argv):
        opt = option(argv[i])
        if opt == b"auth" and i + 2 < len(argv):
            result = _check_password(ctx, argv[i + 2])
            if result is not OK:
                return result
            i += 3
        elif opt == b"setname" and i + 1 < len(argv):
            name = text(argv[i + 1])
            i += 2
        else:
            return err(f"Syntax error in HELLO option '{text(argv[i])}'")
    if not ctx.client.authenticated:
        return ReplyError(
            "NOAUTH",
            "HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time",
        )
    if name is not None:
        ctx.client.name = name
    ctx.client.proto = proto
    return {
        "server": "disque",
        "version": _version(),
        "proto": proto,
        "id": ctx.client.id,
        "mode": "cluster",
        "role": "master",
        "modules": [],
    }


def disque_hello(server: ServerHost) -> Reply:
    return clustercmds.hello(server)


def _version() -> str:

    return VERSION


def info_cmd(ctx: Context, argv: list[bytes]) -> Reply:
    """INFO [section]"""
    if len(argv) > 2:
        return SYNTAX_ERROR
    section = text(argv[1]).lower() if len(argv) == 2 else "default"
    return Verbatim(info.render(ctx.server, section))


def command(ctx: Context, argv: list[bytes]) -> Reply:
    """COMMAND [COUNT|INFO name...|DOCS]: the command table, Redis-style."""
    table = ctx.server.commands
    if len(argv) == 1:
        return [_command_entry(c) for c in table.values()]
    sub = option(argv[1])
    if sub == b"count":
        return len(table)
    if sub == b"info":
        return [
            _command_entry(table[n]) if (n := text(a).lower()) in table else None for a in argv[2:]
        ]
    if sub == b"docs":
        return {}
    return err("Unknown subcommand or wrong number of arguments.")


def _command_entry(c: Command) -> list[Reply]:
    return [c.name, c.arity, [Status(f) for f in sorted(c.flags)], 0, 0, 0]


def client_cmd(ctx: Context, argv: list[bytes]) -> Reply:
    """CLIENT LIST|KILL|GETNAME|SETNAME|SETINFO|ID|INFO|NO-EVICT|NO-TOUCH"""
    sub = option(argv[1])
    handler = _CLIENT_SUBCOMMANDS.get(sub)
    if handler is None:
        return err(
            f"Unknown subcommand '{text(argv[1])}'. Try CLIENT LIST, KILL, GETNAME, SETNAME, SETINFO, ID."
        )
    return handler(ctx, argv)


def _client_list(ctx: Context, argv: list[bytes]) -> Reply:
    now = ctx.server.env.clock.wall_ms()
    lines = [c.info_line(now) for c in ctx.server.clients.values()]
    return Verbatim("".join(line + "\n" for line in lines))


def _client_info(ctx: Context, argv: list[bytes]) -> Reply:
    return Verbatim(ctx.client.info_line(ctx.server.env.clock.wall_ms()) + "\n")


def _client_id(ctx: Context, argv: list[bytes]) -> Reply:
    return ctx.client.id


def _client_getname(ctx: Context, argv: list[bytes]) -> Reply:
    return ctx.client.name or None


def _client_setname(ctx: Context, argv: list[bytes]) -> Reply:
    if len(argv) != 3:
        return err("wrong number of arguments for 'client|setname' command")
    name = text(argv[2])
    if any(ch <= " " or ch > "~" for ch in name):
        return err("Client names cannot contain spaces, newlines or special characters.")
    ctx.client.name = name
    return OK


def _client_setinfo(ctx: Context, argv: list[bytes]) -> Reply:
    if len(argv) != 4:
        return err("wrong number of arguments for 'client|setinfo' command")
    attr, value = option(argv[2]), text(argv[3])
    if any(ch < " " or ch > "~" for ch in value) or " " in value:
        return err(f"{text(argv[2])} cannot contain spaces, newlines or special characters.")
    if attr == b"lib-name":
        ctx.client.lib_name = value
    elif attr == b"lib-ver":
        ctx.client.lib_ver = value
    else:
        return err(f"Unrecognized option '{text(argv[2])}'")
    return OK


def _client_kill(ctx: Context, argv: list[bytes]) -> Reply:
    """CLIENT KILL addr | CLIENT KILL [ID id] [ADDR addr] [LADDR addr] [SKIPME yes|no]"""
    if len(argv) == 3:
        targets = [c for c in ctx.server.clients.values() if c.addr == text(argv[2])]
        if not targets:
            return err("No such client")
        _kill(ctx, targets)
        return OK
    filters, skipme = _kill_filters(argv[2:])
    targets = [
        c
        for c in ctx.server.clients.values()
        if all(f(c) for f in filters) and not (skipme and c is ctx.client)
    ]
    _kill(ctx, targets)
    return len(targets)


def _kill_filters(args: list[bytes]) -> tuple[list[Callable[[Client], bool]], bool]:
    if len(args) % 2:
        raise SYNTAX_ERROR
    filters: list[Callable[[Client], bool]] = []
    skipme = True
    for key, raw in zip(args[::2], args[1::2], strict=True):
        k, v = option(key), text(raw)
        if k == b"id":
            wanted = parse_int(raw, "client-id should be greater than 0")
            filters.append(lambda c, w=wanted: c.id == w)  # type: ignore[misc]
        elif k == b"addr":
            filters.append(lambda c, w=v: c.addr == w)  # type: ignore[misc]
        elif k == b"laddr":
            filters.append(lambda c, w=v: c.laddr == w)  # type: ignore[misc]
        elif k == b"skipme":
            if v.lower() not in ("yes", "no"):
                raise SYNTAX_ERROR
            skipme = v.lower() == "yes"
        else:
            raise SYNTAX_ERROR
    return filters, skipme


def _kill(ctx: Context, targets: list[Client]) -> None:
    for c in targets:
        if c is ctx.client:
            c.close_after_reply = True  # after the OK, like Redis
        elif c.cancel_scope is not None:
            c.cancel_scope.cancel()


def _client_noop(ctx: Context, argv: list[bytes]) -> Reply:
    return OK


_CLIENT_SUBCOMMANDS: dict[bytes, ShellHandler] = {
    b"list": _client_list,
    b"info": _client_info,
    b"id": _client_id,
    b"getname": _client_getname,
    b"setname": _client_setname,
    b"setinfo": _client_setinfo,
    b"kill": _client_kill,
    b"no-evict": _client_noop,
    b"no-touch": _client_noop,
}


def config_cmd(ctx: Context, argv: list[bytes]) -> Reply:
    """CONFIG GET pattern | SET name value | REWRITE | RESETSTAT"""
    sub = option(argv[1])
    config = ctx.server.config
    try:
        if sub == b"get" and len(argv) == 3:
            # A map in RESP3 (as Redis 7 does: redis-py expects one), flat in RESP2.
            found: dict[str | bytes, Reply] = dict(config.config_get(text(argv[2])))
            return found
        if sub == b"set" and len(argv) == 4:
            name = text(argv[2]).lower()
            if name in PROTECTED and not _enabled(ctx, config.enable_protected_configs):
                return err(
                    f"CONFIG SET failed (possibly related to argument '{name}') - can't set "
                    "protected config (enable-protected-configs is "
                    f"{config.enable_protected_configs})"
                )
            config.config_set(name, text(argv[3]))
            ctx.server.config_changed(name)
            return OK
        if sub == b"rewrite" and len(argv) == 2:
            config.rewrite()
            return OK
        if sub == b"resetstat" and len(argv) == 2:
            ctx.server.reset_stats()
            return OK
    except ConfigError as e:
        return err(str(e))
    return err("CONFIG subcommand must be one of GET, SET, RESETSTAT, REWRITE")


def _enabled(ctx: Context, setting: str) -> bool:
    """enable-debug-command / enable-protected-configs for this client:
    yes, or local and the client is on the loopback interface."""
    return setting == "yes" or (setting == "local" and _is_loopback(ctx.client.addr))


def _is_loopback(addr: str) -> bool:
    """``addr`` is ``ip:port`` (an IPv6 address has colons of its own)."""
    host = addr.rpartition(":")[0].strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


DEBUG_REFUSED = (
    'DEBUG command not allowed. If the enable-debug-command option is set to "local", '
    "you can run it from a local connection, otherwise you need to set this option in "
    "the configuration file, and then restart the server."
)


def debug(ctx: Context, argv: list[bytes]) -> Reply:
    """DEBUG FLUSHALL | SLEEP seconds | JOBS | HELP"""
    if not _enabled(ctx, ctx.server.config.enable_debug_command):
        return err(DEBUG_REFUSED)
    sub = option(argv[1])
    if sub == b"flushall":
        # Refused while the AOF cannot be written, as write commands are:
        # the file would keep what memory dropped, and a restart would bring
        # it back (simulator seed 711344).
        misconf = ctx.server.aof.misconf()
        if misconf is not None:
            return misconf
        ctx.server.node.flush_all()
        ctx.server.aof.flushed()
        ctx.server.release_memory_after_a_drop(now=True)
        return OK
    if sub == b"sleep" and len(argv) == 3:
        try:
            seconds = float(argv[2])
        except ValueError:
            return err("value is not a valid float")
        # Like the original, the whole node stops: that is what tests use it for.
        ctx.server.env.block(seconds)
        return OK
    if sub == b"help":
        return [
            "DEBUG FLUSHALL -- forget every job and queue.",
            "DEBUG SLEEP <seconds> -- stop serving for that long.",
        ]
    return err("Syntax error, try DEBUG HELP")


def monitor(ctx: Context, argv: list[bytes]) -> Reply:
    """MONITOR: from now on, stream every command the node receives."""
    ctx.client.monitoring = True
    return OK


def slowlog(ctx: Context, argv: list[bytes]) -> Reply:
    """SLOWLOG GET [n] | LEN | RESET"""
    sub, log = option(argv[1]), ctx.server.slowlog
    if sub == b"get" and len(argv) <= 3:
        count = parse_int(argv[2]) if len(argv) == 3 else 10
        return log.get(count if count >= 0 else len(log.entries))
    if sub == b"len" and len(argv) == 2:
        return len(log.entries)
    if sub == b"reset" and len(argv) == 2:
        log.reset()
        return OK
    return err("Unknown SLOWLOG subcommand or wrong # of args. Try GET, RESET, LEN.")


def latency(ctx: Context, argv: list[bytes]) -> Reply:
    """LATENCY LATEST|HISTORY event|RESET|DOCTOR: events over the threshold."""
    sub = option(argv[1])
    tracker = ctx.server.latency
    if sub == b"latest":
        return tracker.latest()
    if sub == b"history" and len(argv) == 3:
        return tracker.history(text(argv[2]))
    if sub == b"reset":
        return tracker.reset([text(a) for a in argv[2:]])
    if sub == b"doctor":
        return Verbatim(tracker.doctor())
    return err("LATENCY subcommand must be one of LATEST, HISTORY, RESET, DOCTOR")


def shutdown(ctx: Context, argv: list[bytes]) -> Reply:
    """SHUTDOWN [NOSAVE|SAVE|REWRITE-AOF]"""
    mode = option(argv[1]) if len(argv) > 1 else b""
    if len(argv) > 2 or mode not in (b"", b"nosave", b"save", b"rewrite-aof"):
        return SYNTAX_ERROR
    aof = ctx.server.aof
    aof.write_now()  # what the writer has not written yet goes first
    try:
        if mode == b"rewrite-aof":
            # Controlled restart: every job with its queue state, so that
            # aof-enqueue-jobs-once can put the queues back exactly.
            aof.shutdown_rewrite()
        elif mode != b"nosave" and aof.state == "on":
            ctx.server.env.disk.fsync(aof.path)
    except OSError as e:
        return err(f"Errors trying to SHUTDOWN. Check logs. ({e.strerror or e})")
    # Fsynced above (or NOSAVE); and once more at the exit, for what ran
    # while the connections finished (NodeServer._end_after_drain).
    ctx.server.shutdown(fsync_aof=mode != b"nosave", rewrite_aof=mode == b"rewrite-aof")
    # Like Redis, whose process exits: the connection ends with no reply.
    if ctx.client.cancel_scope is not None:
        ctx.client.cancel_scope.cancel()
    ctx.client.close_after_reply = True
    return OK


def bgrewriteaof(ctx: Context, argv: list[bytes]) -> Reply:
    """BGREWRITEAOF: compact the AOF in the background."""
    if not ctx.server.aof.claim_rewrite():
        return err("Background append only file rewriting already in progress")
    ctx.server.spawn(ctx.server.aof.rewrite, True)
    return Status("Background append only file rewriting started")


def _shell(
    name: str, arity: int, flags: str, handler: Callable[[Context, list[bytes]], Any]
) -> Command:
    return Command(name, arity, frozenset(flags.split()), handler, core=False)


SHELL_COMMANDS: dict[str, Command] = {
    c.name: c
    for c in (
        _shell("auth", 2, "noscript loading fast", auth),
        _shell("ping", -1, "fast", ping),
        _shell("info", -1, "loading", info_cmd),
        _shell("shutdown", -1, "admin loading", shutdown),
        _shell("monitor", 1, "admin", monitor),
        _shell("debug", -2, "admin", debug),
        _shell("config", -2, "admin loading", config_cmd),
        _shell("client", -2, "admin", client_cmd),
        _shell("slowlog", -2, "admin", slowlog),
        _shell("time", 1, "fast", time_),
        _shell("command", -1, "loading", command),
        _shell("latency", -2, "admin loading", latency),
        _shell("hello", -1, "fast loading", hello),
        _shell("cluster", -2, "admin", clustercmds.cluster),
        _shell("bgrewriteaof", 1, "admin", bgrewriteaof),
        _shell("quit", -1, "fast loading", quit_),
    )
}
