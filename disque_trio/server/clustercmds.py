"""CLUSTER subcommands and HELLO: the node's view of the cluster."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..core.args import option, parse_int, text
from ..core.ids import new_node_id
from ..core.queuecmds import LEAVING_ERROR
from ..protocol.replies import OK, SYNTAX_ERROR, Reply, ReplyError, Status, err

if TYPE_CHECKING:
    from .host import Context, ServerHost

log = logging.getLogger("disque_trio.cluster")

CLUSTER_PORT_OFFSET = 10000


def cluster(ctx: Context, argv: list[bytes]) -> Reply:
    """CLUSTER MEET|NODES|INFO|MYID|FORGET|RESET|LEAVING|SAVECONFIG"""
    sub = option(argv[1])
    handler = _SUBCOMMANDS.get((sub, len(argv)))
    if handler is None:
        return err("Wrong CLUSTER subcommand or number of arguments")
    return handler(ctx, argv)


def _meet(ctx: Context, argv: list[bytes]) -> Reply:
    """CLUSTER MEET ip port [bus-port]: the handshake runs in the background."""
    ip = text(argv[2])
    try:
        port = parse_int(argv[3])
        cport = parse_int(argv[4]) if len(argv) == 5 else port + CLUSTER_PORT_OFFSET
    except ReplyError:
        return err(f"Invalid TCP port specified: {text(argv[3])}")
    if not 0 < port < 65536 or not 0 < cport < 65536:
        return err(f"Invalid TCP port specified: {text(argv[3])}")
    if not ip or " " in ip:
        return err(f"Invalid node address specified: {ip}:{port}")
    ctx.server.spawn(_meet_task, ctx.server, ip, cport)
    return OK


async def _meet_task(server: ServerHost, ip: str, cport: int) -> None:
    try:
        node_id = await server.bus.meet(ip, cport)
    except Exception as e:  # log and move on: MEET already answered OK
        log.warning("CLUSTER MEET %s:%d failed: %s", ip, cport, e)
        return
    log.info("met node %s at %s:%d", node_id[:8], ip, cport)
    server.after_bus_event()


def _nodes(ctx: Context, argv: list[bytes]) -> Reply:
    return ctx.server.node.cluster.nodes_description()


def _myid(ctx: Context, argv: list[bytes]) -> Reply:
    return ctx.server.node.node_id


def _info(ctx: Context, argv: list[bytes]) -> Reply:
    bus = ctx.server.bus
    fields = [
        *ctx.server.node.cluster.info(),
        ("cluster_stats_frames_sent", bus.frames_out),
        ("cluster_stats_frames_received", bus.frames_in),
        ("cluster_stats_frames_dropped", bus.dropped()),
        ("cluster_stats_bad_frames", bus.bad_frames),
        ("cluster_stats_replaced_links", bus.replaced_links),
    ]
    return "".join(f"{k}:{v}\r\n" for k, v in fields)


def _saveconfig(ctx: Context, argv: list[bytes]) -> Reply:
    ctx.server.save_cluster_config(force=True)
    return OK


def _forget(ctx: Context, argv: list[bytes]) -> Reply:
    node_id = text(argv[2])
    table = ctx.server.node.cluster
    if node_id == table.node_id:
        return err("I tried hard but I can't forget myself...")
    if node_id not in table.nodes:
        return err(f"Unknown node {node_id}")
    table.forget(node_id, ctx.server.env.clock.wall_ms())
    ctx.server.node.forget_node(node_id)
    ctx.server.after_bus_event()
    ctx.server.bus.sync_links()
    return OK


def _reset(ctx: Context, argv: list[bytes]) -> Reply:
    """CLUSTER RESET [HARD|SOFT]: forget every node and every job; HARD
    also takes a new node ID."""
    mode = option(argv[2]) if len(argv) == 3 else b"soft"
    if mode not in (b"hard", b"soft"):
        return SYNTAX_ERROR
    server = ctx.server
    # A reset must reach nodes.conf (a new ID above all): one kept in memory
    # only is undone by a crash, and the node comes back under the identity
    # the cluster was told to forget (simulator seed 201, a full disk). So
    # not while the disk refuses writes, and only once nodes.conf as it is
    # could be written again (the disk takes it).
    misconf = server.aof.misconf()
    if misconf is not None:
        return misconf
    if not server.save_cluster_config(force=True):
        return err(
            f"could not write {server.config.cluster_config_file}: nothing was reset (see the log)"
        )
    new_id = new_node_id(server.env.rng) if mode == b"hard" else None
    server.node.cluster.reset(new_id, server.env.clock.wall_ms())
    if new_id is not None:
        server.node.set_node_id(new_id)
    server.node.flush_all()
    # As DEBUG FLUSHALL: empty the AOF too, or a restart would load the jobs
    # back, under the new ID, listing the old one as a holder (seed 3051).
    server.aof.flushed()
    server.release_memory_after_a_drop(now=True)
    # Connections made before the reset speak for the node we were: a peer
    # still sending over its old link (it has not heard of the reset) would
    # hand us jobs whose holder lists name our old ID, and their acks would
    # wait for that ID for ever (simulator seed 733083056). Peers handshake
    # again and learn the new ID, or are forgotten.
    server.bus.drop_connections()
    server.bus.sync_links()
    server.after_bus_event()
    server.save_cluster_config(force=True)
    return OK


def _leaving(ctx: Context, argv: list[bytes]) -> Reply:
    """CLUSTER LEAVING [yes|no]"""
    table = ctx.server.node.cluster
    if len(argv) == 2:
        return Status("yes" if ctx.server.node.leaving else "no")
    answer = option(argv[2])
    if answer not in (b"yes", b"no"):
        return err("Wrong argument for CLUSTER LEAVING. Use 'yes' or 'no'")
    table.set_leaving(answer == b"yes")
    ctx.server.node.refresh_cluster_view()
    if answer == b"yes":
        # Clients blocked in GETJOB would wait for jobs this node no longer
        # asks for: tell them to go elsewhere.
        ctx.server.node.unblock_all(LEAVING_ERROR)
    ctx.server.save_cluster_config()
    return OK


_SUBCOMMANDS = {
    (b"meet", 4): _meet,
    (b"meet", 5): _meet,
    (b"nodes", 2): _nodes,
    (b"myid", 2): _myid,
    (b"info", 2): _info,
    (b"saveconfig", 2): _saveconfig,
    (b"forget", 3): _forget,
    (b"reset", 2): _reset,
    (b"reset", 3): _reset,
    (b"leaving", 2): _leaving,
    (b"leaving", 3): _leaving,
}


def hello(server: ServerHost) -> Reply:
    """Disque's HELLO: [1, my-id, [id, ip, port, priority]...], port and
    priority as strings, myself first."""
    table = server.node.cluster
    entries: list[Reply] = []
    for node in sorted(table.nodes.values(), key=lambda n: n is not table.myself):
        ip = node.ip or server.announce_ip()
        port = server.port if node is table.myself else node.port
        entries.append([node.node_id, ip, str(port), str(table.priority(node))])
    return [1, table.node_id, *entries]
