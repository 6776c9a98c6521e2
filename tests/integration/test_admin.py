"""Server commands: CLIENT, CONFIG, INFO, MONITOR, SLOWLOG, LATENCY, COMMAND,
TIME, DEBUG, SHUTDOWN; in-process over memory streams."""

from __future__ import annotations

import random

import trio
import trio.testing

from disque_trio.env import Env, TcpNet, TrioClock
from disque_trio.protocol.replies import ReplyError, Status, Verbatim
from disque_trio.server.node import NodeServer
from sim.disk import SimDisk

from ..helpers import make_config, memory_node


async def test_client_list_setname_id_and_kill(autojump_clock: trio.testing.MockClock) -> None:
    async with memory_node() as node:
        a, b = await node.client(), await node.client()
        assert await a.call("CLIENT", "SETNAME", "alpha") == Status("OK")
        bad = await a.call("CLIENT", "SETNAME", "has space")
        assert isinstance(bad, ReplyError)
        a_id = await a.call("CLIENT", "ID")
        b_id = await b.call("CLIENT", "ID")
        assert a_id != b_id
        listing = (await a.call("CLIENT", "LIST")).decode()
        assert f"id={a_id} " in listing and "name=alpha" in listing
        assert await a.call("CLIENT", "SETINFO", "LIB-NAME", "mylib") == Status("OK")
        assert "lib-name=mylib" in (await a.call("CLIENT", "INFO")).decode()
        assert await a.call("CLIENT", "KILL", "ID", b_id) == 1
        assert await b.closed()
        assert isinstance(await a.call("CLIENT", "NOPE"), ReplyError)


async def test_config_get_set(autojump_clock: trio.testing.MockClock) -> None:
    async with memory_node() as node:
        c = await node.client()
        assert await c.call("CONFIG", "GET", "maxmemory") == [b"maxmemory", b"1073741824"]
        assert await c.call("CONFIG", "SET", "maxmemory", "2mb") == Status("OK")
        assert (await c.call("CONFIG", "GET", "maxmem*"))[:2] == [b"maxmemory", b"2097152"]
        err = await c.call("CONFIG", "SET", "maxmemory", "lots")
        assert isinstance(err, ReplyError) and "Invalid argument" in err.message
        err = await c.call("CONFIG", "REWRITE")
        assert isinstance(err, ReplyError) and "without a config file" in err.message
        assert await c.call("CONFIG", "RESETSTAT") == Status("OK")


async def test_info_sections(autojump_clock: trio.testing.MockClock) -> None:
    async with memory_node() as node:
        c = await node.client()
        await c.call("ADDJOB", "q", "x", 0)
        text = (await c.call("INFO")).decode()
        for header in ("# Server", "# Clients", "# Memory", "# Jobs", "# Queues"):
            assert header in text
        fields = dict(
            line.split(":", 1) for line in text.split("\r\n") if line and not line.startswith("#")
        )
        assert fields["registered_jobs"] == "1" and fields["registered_queues"] == "1"
        assert fields["aof_state"] == "off" and "used_memory" in fields
        jobs_only = (await c.call("INFO", "jobs")).decode()
        assert jobs_only.startswith("# Jobs") and "# Server" not in jobs_only
        assert await c.call("INFO", "nosuchsection") == b""


async def test_monitor_sees_other_clients_commands(autojump_clock: trio.testing.MockClock) -> None:
    async with memory_node() as node:
        mon, other = await node.client(), await node.client()
        assert await mon.call("MONITOR") == Status("OK")
        await other.call("QLEN", "watched")
        line = await mon.read()
        assert isinstance(line, Status) and '"QLEN" "watched"' in line


async def test_slowlog_records_slow_commands(autojump_clock: trio.testing.MockClock) -> None:
    async with memory_node(slowlog_log_slower_than=0) as node:
        c = await node.client()
        await c.call("QLEN", "q")
        entries = await c.call("SLOWLOG", "GET")
        assert any(entry[3] == [b"QLEN", b"q"] for entry in entries)
        assert await c.call("SLOWLOG", "LEN") >= 1
        assert await c.call("SLOWLOG", "RESET") == Status("OK")
        assert await c.call("SLOWLOG", "LEN") <= 1


async def test_latency_answers(autojump_clock: trio.testing.MockClock) -> None:
    async with memory_node() as node:
        c = await node.client()
        assert await c.call("LATENCY", "LATEST") == []
        assert await c.call("LATENCY", "HISTORY", "command") == []
        assert await c.call("LATENCY", "RESET") == 0
        assert b"no latency" in await c.call("LATENCY", "DOCTOR")


async def test_command_time_ping(autojump_clock: trio.testing.MockClock) -> None:
    async with memory_node() as node:
        c = await node.client()
        count = await c.call("COMMAND", "COUNT")
        assert count == len(await c.call("COMMAND")) and count > 25
        info = await c.call("COMMAND", "INFO", "addjob", "nosuch")
        assert info[0][0] == b"addjob" and info[0][1] == -4 and info[1] is None
        seconds, micros = await c.call("TIME")
        assert int(seconds) > 1_600_000_000 and 0 <= int(micros) < 1_000_000
        assert await c.call("PING", "hello") == b"hello"


async def test_debug_flushall_and_shutdown(autojump_clock: trio.testing.MockClock) -> None:
    async with memory_node(enable_debug_command="yes") as node:
        c = await node.client()
        await c.call("ADDJOB", "q", "x", 0)
        assert await c.call("DEBUG", "FLUSHALL") == Status("OK")
        assert await c.call("QLEN", "q") == 0
        assert isinstance(await c.call("DEBUG", "NOPE"), ReplyError)
        # Like Redis, whose process exits: no reply, the connection closes.
        await c.send("SHUTDOWN", "NOSAVE")
        assert await c.closed()
        assert node.server.shutdown_requested


async def test_quit_closes_after_reply(autojump_clock: trio.testing.MockClock) -> None:
    async with memory_node() as node:
        c = await node.client()
        assert await c.call("QUIT") == Status("OK")
        assert await c.closed()


async def test_maxclients(autojump_clock: trio.testing.MockClock) -> None:
    async with memory_node(maxclients=1) as node:
        first = await node.client()
        assert await first.call("PING") == Status("PONG")
        second = await node.client()
        reply = await second.read()
        assert isinstance(reply, ReplyError) and "max number of clients" in reply.message


async def test_verbatim_info_in_resp3(autojump_clock: trio.testing.MockClock) -> None:
    async with memory_node() as node:
        c = await node.client()
        await c.call("HELLO", 3)
        info = await c.call("INFO", "server")
        assert isinstance(info, Verbatim) and info.startswith("# Server")


async def test_idle_clients_are_closed_after_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with memory_node(timeout=5) as node:
        idle, blocked = await node.client(), await node.client()
        await idle.call("PING")
        await blocked.send("GETJOB", "FROM", "q")
        await trio.sleep(6)
        assert await idle.closed()
        # A client blocked in GETJOB is not idle: it is still served.
        await (await node.client()).call("ADDJOB", "q", "x", 0)
        assert (await blocked.read())[0][2] == b"x"


async def test_debug_and_protected_configs_are_closed_by_default(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Redis 7's defaults: no DEBUG, no CONFIG SET dir (a client could make
    BGREWRITEAOF write anywhere); one directive gives them back. These
    in-memory clients are not on the loopback interface: ``local`` refuses
    them too (tests/integration/test_clients.py runs DEBUG from loopback)."""
    for setting in ("no", "local"):
        async with memory_node(
            enable_debug_command=setting, enable_protected_configs=setting
        ) as node:
            c = await node.client()
            reply = await c.call("DEBUG", "SLEEP", "0")
            assert isinstance(reply, ReplyError) and reply.line.startswith(
                "ERR DEBUG command not allowed. If the enable-debug-command option is set"
            )
            reply = await c.call("CONFIG", "SET", "dir", "/tmp")
            assert isinstance(reply, ReplyError)
            assert "can't set protected config" in reply.line
            assert await c.call("CONFIG", "SET", "maxmemory", "2gb") == Status("OK")
            assert await c.call("CONFIG", "GET", "enable-debug-command") == [
                b"enable-debug-command",
                setting.encode(),
            ]
            reply = await c.call("CONFIG", "SET", "enable-debug-command", "yes")
            assert isinstance(reply, ReplyError)  # at start only
    async with memory_node(enable_debug_command="yes", enable_protected_configs="yes") as node:
        c = await node.client()
        assert await c.call("DEBUG", "SLEEP", "0") == Status("OK")
        assert await c.call("CONFIG", "SET", "dir", ".") == Status("OK")


def test_which_client_addresses_are_local() -> None:
    from disque_trio.server.admin import _is_loopback

    assert _is_loopback("127.0.0.1:51234") and _is_loopback("127.8.0.2:1")
    assert _is_loopback("::1:51234") and _is_loopback("[::1]:6")
    assert not _is_loopback("10.0.0.7:51234") and not _is_loopback("memory:0")
    assert not _is_loopback("?:0")


async def test_what_runs_during_the_shutdown_drain_is_fsynced(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Simulator seed 500542: another client's ADDJOB ran 5 ms after a
    SHUTDOWN REWRITE-AOF, while the connections finished their replies; it
    was answered OK, and its record reached the AOF after the last fsync
    (lost in a crash after the restart). The AOF is fsynced again at the
    exit, after the drain."""
    disk = SimDisk()
    env = Env(clock=TrioClock(), rng=random.Random(1), net=TcpNet(), disk=disk)
    server = NodeServer(
        make_config(appendonly="yes", appendfsync="everysec"), env, persist_cluster=False
    )
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run, [])
            _, theirs = trio.testing.memory_stream_pair()
            client = server.new_client(theirs)
            assert client is not None
            server.shutdown()
            job_id = server.execute(client, [b"ADDJOB", b"q", b"x", b"0"])  # during the drain
            assert isinstance(job_id, Status)
            server.commit()
    disk.crash()  # the machine goes down after the exit
    assert str(job_id).encode() in (disk.read(server.aof.path) or b"")
