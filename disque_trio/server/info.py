"""INFO: the Redis INFO text format with the original Disque's field names."""

from __future__ import annotations

import platform
import resource
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from .version import PACKAGE_VERSION, VERSION, git_sha1

if TYPE_CHECKING:
    from .host import ServerHost

Section = Callable[["ServerHost"], list[tuple[str, object]]]


def _server(s: ServerHost) -> list[tuple[str, object]]:

    uptime = s.uptime_s()
    proc = s.process_info()
    uname = platform.uname()
    return [
        ("disque_version", VERSION),
        ("disque_trio_version", PACKAGE_VERSION),
        ("disque_git_sha1", git_sha1()),
        ("disque_git_dirty", 0),
        ("os", f"{uname.system} {uname.release} {uname.machine}"),
        ("arch_bits", 64 if sys.maxsize > 2**32 else 32),
        ("multiplexing_api", "trio"),
        ("python_version", platform.python_version()),
        ("process_id", proc["pid"]),
        ("run_id", s.node.node_id),
        ("tcp_port", s.port),
        ("uptime_in_seconds", uptime),
        ("uptime_in_days", uptime // 86400),
        ("hz", s.config.hz),
        ("executable", proc["executable"]),
        ("config_file", s.config.path or ""),
    ]


def _clients(s: ServerHost) -> list[tuple[str, object]]:
    biggest = max((c.qbuf for c in s.clients.values()), default=0)
    return [
        ("connected_clients", len(s.clients)),
        ("client_longest_output_list", 0),
        ("client_biggest_input_buf", biggest),
        ("blocked_clients", s.node.stats.blocked_clients),
    ]


def _memory(s: ServerHost) -> list[tuple[str, object]]:
    used = s.used_memory()
    s.peak_memory = max(s.peak_memory, used)
    rss = s.env.rss() or used
    # used_memory estimates what the jobs and queues take; the process also
    # holds the interpreter and its modules (used_memory_startup, tens of
    # MB). The ratio compares RSS with both, so an idle node reads about 1
    # (RSS / used_memory alone read 33 and alarmed Redis users).
    expected = used + s.startup_rss
    return [
        ("used_memory", used),
        ("used_memory_human", human_bytes(used)),
        ("used_memory_rss", rss),
        ("used_memory_peak", s.peak_memory),
        ("used_memory_peak_human", human_bytes(s.peak_memory)),
        ("used_memory_startup", s.startup_rss),
        ("mem_fragmentation_ratio", f"{rss / expected:.2f}" if expected else "0.00"),
        ("mem_allocator", "pymalloc"),
        ("maxmemory", s.config.maxmemory),
        ("maxmemory_human", human_bytes(s.config.maxmemory)),
    ]


def _jobs(s: ServerHost) -> list[tuple[str, object]]:
    return [("registered_jobs", len(s.node.jobs))]


def _queues(s: ServerHost) -> list[tuple[str, object]]:
    return [("registered_queues", len(s.node.queues))]


def _persistence(s: ServerHost) -> list[tuple[str, object]]:
    return s.persistence_info()


def _stats(s: ServerHost) -> list[tuple[str, object]]:
    st = s.node.stats
    return [
        ("total_connections_received", s.stat_connections),
        ("total_commands_processed", s.stat_commands),
        ("instantaneous_ops_per_sec", s.ops_per_sec()),
        ("total_net_input_bytes", s.stat_net_in),
        ("total_net_output_bytes", s.stat_net_out),
        ("rejected_connections", s.stat_rejected),
        ("client_query_buffer_limit_disconnections", s.stat_query_buffer_closed),
        ("tls_handshake_failures", s.stat_tls_refused),
        ("pubsub_channels", len(s.pubsub.channels)),
        ("pubsub_patterns", len(s.pubsub.patterns)),
        ("pubsub_clients", s.pubsub.subscribed_clients()),
        ("pubsub_published", s.pubsub.published),
        ("pubsub_received", s.pubsub.received),
        ("pubsub_delivered", s.pubsub.delivered),
        ("pubsub_buffered_bytes", s.pubsub.buffered()),
        ("pubsub_clients_dropped", s.pubsub.dropped_clients),
        ("added_jobs", st.added_jobs),
        ("delivered_jobs", st.delivered_jobs),
        ("acked_jobs", st.acked_jobs),
        ("expired_jobs", st.expired_jobs),
    ]


def _cpu(s: ServerHost) -> list[tuple[str, object]]:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return [
        ("used_cpu_sys", f"{me.ru_stime:.2f}"),
        ("used_cpu_user", f"{me.ru_utime:.2f}"),
        ("used_cpu_sys_children", f"{kids.ru_stime:.2f}"),
        ("used_cpu_user_children", f"{kids.ru_utime:.2f}"),
    ]


SECTIONS: dict[str, tuple[str, Section]] = {
    "server": ("Server", _server),
    "clients": ("Clients", _clients),
    "memory": ("Memory", _memory),
    "jobs": ("Jobs", _jobs),
    "queues": ("Queues", _queues),
    "persistence": ("Persistence", _persistence),
    "stats": ("Stats", _stats),
    "cpu": ("CPU", _cpu),
}


def render(server: ServerHost, section: str) -> str:
    """The INFO text for one section, 'default' or 'all'; '' when unknown."""
    names = list(SECTIONS) if section in ("default", "all", "everything") else [section]
    names += server.extra_info_sections(section)
    blocks = []
    for name in names:
        if name in SECTIONS:
            title, fn = SECTIONS[name]
            fields = fn(server)
        else:
            extra = server.extra_info(name)
            if extra is None:
                continue
            title, fields = extra
        lines = [f"# {title}"] + [f"{k}:{v}" for k, v in fields]
        blocks.append("\r\n".join(lines) + "\r\n")
    return "\r\n".join(blocks)


def human_bytes(n: int) -> str:
    """Like Redis' bytesToHuman: 1.50K, 12.00M, ..."""
    for unit, size in (
        ("P", 1 << 50),
        ("T", 1 << 40),
        ("G", 1 << 30),
        ("M", 1 << 20),
        ("K", 1 << 10),
    ):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return f"{n}B"
