"""disque.conf parsing, CONFIG GET/SET/REWRITE and the command line."""

from __future__ import annotations

import io
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disque_trio.config import (
    DIRECTIVES,
    REWRITE_SIGNATURE,
    BoolKind,
    Config,
    ConfigError,
    EnumKind,
    IntKind,
    MemoryKind,
    OctalKind,
    OutputBufferLimit,
    OutputBufferLimitKind,
    PathKind,
    PortOrAutoKind,
    StringKind,
    WordsKind,
    format_memory,
    parse_argv,
    parse_memory,
    quote_arg,
    split_args,
    usage,
)


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def load_text(tmp_path: Path, text: str) -> Config:
    return Config.load(str(write(tmp_path / "disque.conf", text)), [])


def load_error(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_text(tmp_path, text)
    return str(info.value)


# --------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------


def test_defaults_are_the_originals() -> None:
    config = Config()
    assert config.port == 7711
    assert config.tcp_backlog == 511
    assert config.bind == ("127.0.0.1",)
    assert config.loglevel == "notice"
    assert config.logfile == ""
    assert config.dir == "."
    assert config.maxclients == 10000
    assert config.maxmemory == 1024**3
    assert config.maxmemory_policy == "acks"
    assert config.appendonly is False
    assert config.appendfilename == "disque.aof"
    assert config.appendfsync == "everysec"
    assert config.auto_aof_rewrite_percentage == 100
    assert config.auto_aof_rewrite_min_size == 64 * 1024**2
    assert config.aof_load_truncated is True
    assert config.aof_enqueue_jobs_once is False
    assert config.cluster_config_file == "nodes.conf"
    assert config.cluster_node_timeout == 15000
    assert config.slowlog_log_slower_than == 10000
    assert config.slowlog_max_len == 128
    assert config.latency_monitor_threshold == 0
    assert config.hz == 10
    assert config.proto_max_bulk_len == 512 * 1024**2
    assert config.web_port is None
    assert config.web_allowed_origins == ()
    assert config.path is None


def test_table_matches_the_fields() -> None:
    config = Config()
    for name, directive in DIRECTIVES.items():
        assert name == name.lower()
        assert directive.attr == name.replace("-", "_")
        assert config.get(name) == directive.default
    assert "include" not in DIRECTIVES
    assert "rename-command" not in DIRECTIVES


def test_every_default_survives_its_own_file_line(tmp_path: Path) -> None:
    lines = [d.line(d.default) for d in DIRECTIVES.values()]
    config = load_text(tmp_path, "\n".join(lines) + "\n")
    assert config.values() == Config().values()


def test_the_originals_example_file_loads(tmp_path: Path) -> None:
    # A trimmed copy of the lines the original disque.conf ships uncommented.
    config = load_text(
        tmp_path,
        "daemonize no\npidfile /var/run/disque.pid\nport 7711\ntcp-backlog 511\n"
        'timeout 0\ntcp-keepalive 0\nloglevel notice\nlogfile ""\ndir ./\n'
        'appendonly no\nappendfilename "disque.aof"\nappendfsync everysec\n'
        "auto-aof-rewrite-percentage 100\nauto-aof-rewrite-min-size 64mb\n"
        "aof-load-truncated yes\naof-enqueue-jobs-once no\n"
        "slowlog-log-slower-than 10000\nslowlog-max-len 128\n"
        "latency-monitor-threshold 0\nclient-output-buffer-limit normal 0 0 0\n"
        "hz 10\naof-rewrite-incremental-fsync yes\n",
    )
    assert config.dir == "./"
    assert config.ignored_settings() == []


# --------------------------------------------------------------------------
# Splitting and quoting
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "args"),
    [
        ("port 7711", ["port", "7711"]),
        ("  bind   1.2.3.4\t::1  ", ["bind", "1.2.3.4", "::1"]),
        ('logfile ""', ["logfile", ""]),
        ('requirepass "a b"', ["requirepass", "a b"]),
        ("requirepass 'a b'", ["requirepass", "a b"]),
        (r'x "\x41\n\t\\\"z"', ["x", 'A\n\t\\"z']),
        (r"x 'it\'s \n'", ["x", "it's \\n"]),
        ('x foo"bar"', ["x", "foobar"]),
        (r'x "\q"', ["x", "q"]),
        (r'x "\x4"', ["x", "x4"]),
        ('x "caf\\xc3\\xa9"', ["x", "café"]),
        # A NUL ends the line, as in C (this used to loop for ever).
        ("x a\x00b c", ["x", "a"]),
        ("", []),
    ],
)
def test_split_args_like_sdssplitargs(line: str, args: list[str]) -> None:
    assert split_args(line) == args


@pytest.mark.parametrize("line", ['x "abc', "x 'abc", 'x "a"b', "x 'a'b", 'x "abc\\'])
def test_split_args_rejects_unbalanced_quotes(line: str) -> None:
    with pytest.raises(ValueError):
        split_args(line)


@given(st.text())
def test_quote_arg_round_trips(value: str) -> None:
    assert split_args(quote_arg(value)) == [value]
    assert split_args("x " + quote_arg(value) + " y") == ["x", value, "y"]


def test_quote_arg_leaves_plain_words_bare() -> None:
    assert quote_arg("nodes.conf") == "nodes.conf"
    assert quote_arg("") == '""'
    assert quote_arg("a b") == '"a b"'


# --------------------------------------------------------------------------
# Memory sizes
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "n"),
    [
        ("100", 100),
        ("100b", 100),
        ("1k", 1000),
        ("1kb", 1024),
        ("1m", 1000**2),
        ("1mb", 1024**2),
        ("1g", 1000**3),
        ("1gb", 1024**3),
        ("5GB", 5 * 1024**3),
        ("2Mb", 2 * 1024**2),
    ],
)
def test_parse_memory_units(text: str, n: int) -> None:
    assert parse_memory(text) == n


@pytest.mark.parametrize("text", ["", "mb", "1tb", "1 mb", "1.5gb", "+1", "0x10"])
def test_parse_memory_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_memory(text)


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0"), (1000, "1000"), (1024, "1kb"), (64 * 1024**2, "64mb"), (3 * 1024**3, "3gb")],
)
def test_format_memory(n: int, text: str) -> None:
    assert format_memory(n) == text


@given(st.integers(min_value=0, max_value=2**62))
def test_format_memory_round_trips(n: int) -> None:
    assert parse_memory(format_memory(n)) == n


# --------------------------------------------------------------------------
# Loading files
# --------------------------------------------------------------------------


def test_load_comments_quotes_case_and_last_wins(tmp_path: Path) -> None:
    config = load_text(
        tmp_path,
        "# a comment\n"
        "\n"
        "   # an indented comment\n"
        "PORT 7000\r\n"
        "port 7001\n"
        "bind 10.0.0.1 ::1\n"
        'requirepass "with space"\n'
        "logfile '/var/log/disque trio.log'\n"
        "maxmemory 2GB\n"
        "appendonly YES\n"
        "loglevel Warning\n",
    )
    assert config.port == 7001
    assert config.bind == ("10.0.0.1", "::1")
    assert config.requirepass == "with space"
    assert config.logfile == "/var/log/disque trio.log"
    assert config.maxmemory == 2 * 1024**3
    assert config.appendonly is True
    assert config.loglevel == "warning"
    assert config.path == str(tmp_path / "disque.conf")


def test_include_is_relative_to_the_including_file(tmp_path: Path) -> None:
    (tmp_path / "conf.d").mkdir()
    write(tmp_path / "conf.d" / "common.conf", "port 7100\ninclude more.conf\n")
    write(tmp_path / "conf.d" / "more.conf", "hz 50\n")
    config = load_text(tmp_path, "include conf.d/common.conf\nmaxclients 5\n")
    assert (config.port, config.hz, config.maxclients) == (7100, 50, 5)


def test_include_order_decides_who_wins(tmp_path: Path) -> None:
    write(tmp_path / "other.conf", "port 7100\n")
    assert load_text(tmp_path, "port 7000\ninclude other.conf\n").port == 7100
    assert load_text(tmp_path, "include other.conf\nport 7000\n").port == 7000


def test_include_loop_is_an_error(tmp_path: Path) -> None:
    write(tmp_path / "a.conf", "include disque.conf\n")
    message = load_error(tmp_path, "port 7000\ninclude a.conf\n")
    assert message == (
        f"{tmp_path / 'a.conf'} line 1: 'include disque.conf': include loop: "
        f"'{tmp_path / 'disque.conf'}' is already being read"
    )


def test_missing_include_names_the_including_line(tmp_path: Path) -> None:
    message = load_error(tmp_path, "\ninclude nope.conf\n")
    assert message.startswith(f"{tmp_path / 'disque.conf'} line 2: 'include nope.conf': ")
    assert f"Can't open config file '{tmp_path / 'nope.conf'}'" in message


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"Can't open config file '.*nope\.conf'"):
        Config.load(str(tmp_path / "nope.conf"), [])


def test_relative_path_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path / "disque.conf", "port 7002\n")
    monkeypatch.chdir(tmp_path)
    config = Config.load("disque.conf", [])
    assert config.path == str(tmp_path / "disque.conf")


def test_stdin_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("port 7003\nbogus\n"))
    with pytest.raises(ConfigError, match=r"^Bad directive .* in stdin line 2: 'bogus'$"):
        Config.load("-", [])
    monkeypatch.setattr("sys.stdin", io.StringIO("port 7003\n"))
    config = Config.load("-", [])
    assert (config.port, config.path) == (7003, None)


def test_bad_directive_message(tmp_path: Path) -> None:
    message = load_error(tmp_path, "# one\n\nport 7711\nfoo bar\n")
    path = tmp_path / "disque.conf"
    assert message == f"Bad directive or wrong number of arguments in {path} line 4: 'foo bar'"


@pytest.mark.parametrize("line", ["port", "port 1 2", "appendfsync", "client-output-buffer-limit"])
def test_wrong_number_of_arguments(tmp_path: Path, line: str) -> None:
    message = load_error(tmp_path, line + "\n")
    assert message.startswith("Bad directive or wrong number of arguments in ")
    assert message.endswith(f" line 1: '{line}'")


def test_unbalanced_quotes_message(tmp_path: Path) -> None:
    message = load_error(tmp_path, 'port 7711\nrequirepass "abc\n')
    assert (
        message == f"Unbalanced quotes in {tmp_path / 'disque.conf'} line 2: 'requirepass \"abc'"
    )


def test_rename_command_is_refused(tmp_path: Path) -> None:
    message = load_error(tmp_path, "rename-command CONFIG xyz\n")
    assert message == (
        f"{tmp_path / 'disque.conf'} line 1: 'rename-command CONFIG xyz': "
        "rename-command is not supported by disque-trio"
    )


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("port abc", "must be an integer between 0 and 65535"),
        ("port 65536", "must be an integer between 0 and 65535"),
        ("port 12abc", "must be an integer between 0 and 65535"),
        ("port +1", "must be an integer between 0 and 65535"),
        ("timeout -1", "must be an integer >= 0"),
        ("maxclients 0", "must be an integer >= 1"),
        ("hz fast", "must be an integer"),
        ("slowlog-log-slower-than 1e3", "must be an integer"),
        ("maxmemory 1tb", "must be a memory size like 100mb or 1gb"),
        ("maxmemory 0", "at least 1"),
        ("proto-max-bulk-len 1000", "at least 1mb"),
        ("appendonly maybe", "must be 'yes' or 'no'"),
        ("appendfsync sometimes", "must be one of everysec, always, no"),
        ("loglevel loud", "must be one of debug, verbose, notice, warning"),
        ("syslog-facility local8", "must be one of user, local0,"),
        ("maxmemory-policy allkeys-lru", "must be one of acks, noeviction"),
        ("appendfilename dir/disque.aof", "must be a file name, not a path"),
        ("unixsocketperm 800", "must be octal permission bits"),
        ("requirepass " + "x" * 513, "must be at most 512 characters long"),
        ("bind " + " ".join(["::1"] * 17), "accepts at most 16 addresses"),
        ('bind ""', "needs at least 1 addresses"),
        ("client-output-buffer-limit slave 0 0 0", "unknown client class 'slave'"),
        ("client-output-buffer-limit normal 1x 0 0", "must be a memory size"),
        ("client-output-buffer-limit normal 0 0 -1", "must be an integer >= 0"),
        ("web-port none", "must be an integer between 0 and 65535"),
        ('dir "a\\x00b"', "must not contain a NUL character"),
    ],
)
def test_bad_values_name_file_line_and_directive(tmp_path: Path, line: str, reason: str) -> None:
    message = load_error(tmp_path, "# header\n" + line + "\n")
    name, _, value = line.partition(" ")
    shown = " ".join(split_args(value))
    prefix = f"{tmp_path / 'disque.conf'} line 2: '{name}' value '{shown}': "
    assert message.startswith(prefix)
    assert reason in message[len(prefix) :]
    assert "\n" not in message


def test_hz_is_capped_not_refused(tmp_path: Path) -> None:
    assert load_text(tmp_path, "hz 1000\n").hz == 500
    assert load_text(tmp_path, "hz -3\n").hz == 1


def test_values_of_each_kind(tmp_path: Path) -> None:
    config = load_text(
        tmp_path,
        "unixsocketperm 700\n"
        "client-output-buffer-limit normal 32mb 16mb 60\n"
        "web-port 0\n"
        "web-allowed-origins https://a.example https://b.example\n"
        "slowlog-log-slower-than -1\n",
    )
    assert config.unixsocketperm == 0o700
    assert config.client_output_buffer_limit == OutputBufferLimit(32 * 1024**2, 16 * 1024**2, 60)
    assert config.web_port == 0
    assert config.web_allowed_origins == ("https://a.example", "https://b.example")
    assert config.slowlog_log_slower_than == -1


def test_derived_ports(tmp_path: Path) -> None:
    config = load_text(tmp_path, "port 7000\n")
    assert (config.cluster_bus_port(), config.web_listen_port()) == (17000, 8000)
    config = load_text(tmp_path, "port 7000\ncluster-port 9000\nweb-port 0\n")
    assert (config.cluster_bus_port(), config.web_listen_port()) == (9000, None)
    assert load_text(tmp_path, "web-port 8080\n").web_listen_port() == 8080
    assert load_text(tmp_path, "port 0\n").web_listen_port() is None


def test_a_port_too_high_for_derived_ports_needs_them_set(tmp_path: Path) -> None:
    assert "set cluster-port" in load_error(tmp_path, "port 60000\n")
    assert "set web-port" in load_error(tmp_path, "port 65000\ncluster-port 1\n")
    config = load_text(tmp_path, "port 65000\ncluster-port 1\nweb-port 0\n")
    assert config.cluster_bus_port() == 1


def test_ignored_settings(tmp_path: Path) -> None:
    config = load_text(tmp_path, "daemonize yes\nsyslog-enabled no\nunixsocket /tmp/d.sock\n")
    assert config.ignored_settings() == ["daemonize", "unixsocket"]


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], (None, [])),
        (["disque.conf"], ("disque.conf", [])),
        (["-"], ("-", [])),
        (["--port", "7777"], (None, [("port", ["7777"])])),
        (
            ["/etc/d.conf", "--loglevel", "verbose", "--bind", "1.2.3.4", "::1"],
            ("/etc/d.conf", [("loglevel", ["verbose"]), ("bind", ["1.2.3.4", "::1"])]),
        ),
        (["--appendonly"], (None, [("appendonly", [])])),
        (["--slowlog-log-slower-than", "-1"], (None, [("slowlog-log-slower-than", ["-1"])])),
    ],
)
def test_parse_argv(argv: list[str], expected: tuple[str | None, Any]) -> None:
    assert parse_argv(argv) == expected


def test_parse_argv_stray_value() -> None:
    with pytest.raises(ConfigError, match=r"^command line: 'extra': expected a --directive"):
        parse_argv(["disque.conf", "extra", "--port", "1"])


@pytest.mark.parametrize(
    ("argv", "suggestion"),
    [
        (["port", "7716"], "--port 7716"),
        (["Port", "7716", "--dir", "x"], "--port 7716"),
        (["-loglevel", "verbose"], "--loglevel verbose"),
        (["appendonly"], "--appendonly"),
    ],
)
def test_a_directive_in_place_of_the_config_file(
    argv: list[str], suggestion: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        parse_argv(argv)
    assert str(info.value) == (
        f"command line: '{argv[0]}' is a directive, not a config file: "
        f"did you mean '{suggestion}'?"
    )


def test_a_config_file_named_like_a_directive_still_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "port", "port 7716\n")
    assert parse_argv(["port"]) == ("port", [])


def test_overrides_win_in_order(tmp_path: Path) -> None:
    path = write(tmp_path / "disque.conf", "port 7000\nhz 20\n")
    config = Config.load(str(path), [("port", ["7001"]), ("PORT", ["7002"]), ("bind", ["::1"])])
    assert (config.port, config.hz, config.bind) == (7002, 20, ("::1",))


def test_overrides_without_a_file() -> None:
    config = Config.load(None, [("requirepass", ["s3cret"])])
    assert (config.requirepass, config.path) == ("s3cret", None)


def test_override_errors() -> None:
    with pytest.raises(ConfigError) as info:
        Config.load(None, [("port", ["abc"])])
    assert str(info.value) == (
        "command line: '--port abc': must be an integer between 0 and 65535"
    )
    with pytest.raises(ConfigError) as info:
        Config.load(None, [("foo", ["bar"])])
    assert str(info.value) == (
        "Bad directive or wrong number of arguments in command line: '--foo bar'"
    )
    with pytest.raises(ConfigError, match=r"^command line: '--rename-command a b': "):
        Config.load(None, [("rename-command", ["a", "b"])])


def test_override_include(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path / "extra.conf", "port 7300\n")
    monkeypatch.chdir(tmp_path)
    assert Config.load(None, [("include", ["extra.conf"])]).port == 7300


# --------------------------------------------------------------------------
# CONFIG GET
# --------------------------------------------------------------------------


def test_config_get_star_lists_everything_in_table_order() -> None:
    pairs = Config().config_get("*")
    assert [name for name, _ in pairs] == list(DIRECTIVES)


def test_config_get_renders_like_redis() -> None:
    config = Config.load(None, [("bind", ["127.0.0.1", "::1"]), ("unixsocketperm", ["755"])])
    got = dict(config.config_get("*"))
    assert got["port"] == "7711"
    assert got["maxmemory"] == "1073741824"
    assert got["auto-aof-rewrite-min-size"] == "67108864"
    assert got["appendonly"] == "no"
    assert got["activerehashing"] == "yes"
    assert got["bind"] == "127.0.0.1 ::1"
    assert got["unixsocketperm"] == "755"
    assert got["requirepass"] == ""
    assert got["client-output-buffer-limit"] == "normal 0 0 0"
    assert got["web-port"] == "auto"


@pytest.mark.parametrize(
    ("pattern", "names"),
    [
        ("port", ["port"]),
        ("PORT", ["port"]),
        ("append*", ["appendonly", "appendfilename", "appendfsync"]),
        ("*port", ["port", "cluster-port", "cluster-announce-port", "web-port", "tls-port"]),
        ("h?", ["hz"]),
        (
            "[d-e]*",
            ["daemonize", "databases", "dir", "enable-debug-command", "enable-protected-configs"],
        ),
        ("[^a-z]*", []),
        ("sys*-[ei]*", ["syslog-enabled", "syslog-ident"]),
        ("no\\-such", []),
        ("tcp-keepalive\\", []),
        ("[]", []),
        ("", []),
    ],
)
def test_config_get_patterns(pattern: str, names: list[str]) -> None:
    assert [name for name, _ in Config().config_get(pattern)] == names


# --------------------------------------------------------------------------
# CONFIG SET
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "typed"),
    [
        ("maxmemory", "2gb", 2 * 1024**3),
        ("maxmemory", "1000000", 1000000),
        ("loglevel", "WARNING", "warning"),
        ("appendonly", "yes", True),
        ("hz", "1000", 500),
        ("requirepass", "", ""),
        ("requirepass", "a b", "a b"),
        ("client-output-buffer-limit", "normal 1mb 0 10", OutputBufferLimit(1024**2, 0, 10)),
        ("web-allowed-origins", "https://a https://b", ("https://a", "https://b")),
        ("web-allowed-origins", "", ()),
        ("slowlog-log-slower-than", "-1", -1),
        ("Aof-Enqueue-Jobs-Once", "yes", True),
    ],
)
def test_config_set_good(name: str, value: str, typed: object) -> None:
    config = Config()
    assert config.config_set(name, value) == typed
    assert config.get(name) == typed


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("maxmemory", "lots"),
        ("maxmemory", "0"),
        ("timeout", "-1"),
        ("loglevel", "loud"),
        ("appendonly", "1"),
        ("requirepass", "x" * 513),
        ("client-output-buffer-limit", "normal 0 0"),
        ("client-output-buffer-limit", "pubsub 0 0 0"),
        ("cluster-node-timeout", "0"),
        ("requirepass", "\ud800"),
        ("dir", "\ud800"),
        ("web-allowed-origins", "https://a \ud800"),
    ],
)
def test_config_set_bad_value(name: str, value: str) -> None:
    config = Config()
    before = config.values()
    with pytest.raises(ConfigError) as info:
        config.config_set(name, value)
    assert str(info.value) == f"Invalid argument '{value}' for CONFIG SET '{name}'"
    assert config.values() == before


@pytest.mark.parametrize("name", ["port", "bind", "daemonize", "appendfilename", "foo", "include"])
def test_config_set_unsupported(name: str) -> None:
    with pytest.raises(ConfigError) as info:
        Config().config_set(name, "1")
    assert str(info.value) == f"Unsupported CONFIG parameter: {name}"


@given(st.sampled_from([d for d in DIRECTIVES.values() if d.mutable]))
def test_config_get_output_is_accepted_by_config_set(directive: Any) -> None:
    config = Config()
    ((name, shown),) = config.config_get(directive.name)
    assert config.config_set(name, shown) == directive.default


# --------------------------------------------------------------------------
# CONFIG REWRITE
# --------------------------------------------------------------------------

ORIGINAL = """\
# Disque configuration file

# Network
port 7711
bind 127.0.0.1

# Memory
maxmemory 1GB{trailing}
maxmemory 2gb
include extra.conf

# Persistence
appendonly no
appendfsync everysec
"""


def rewrite_case(tmp_path: Path) -> tuple[Config, Path]:
    write(tmp_path / "extra.conf", "hz 20\n")
    path = write(tmp_path / "disque.conf", ORIGINAL.format(trailing="   "))
    return Config.load(str(path), [("timeout", ["30"])]), path


def test_rewrite_without_a_file() -> None:
    with pytest.raises(ConfigError) as info:
        Config().rewrite()
    assert str(info.value) == "The server is running without a config file"


def test_rewrite_keeps_the_file_when_nothing_changed(tmp_path: Path) -> None:
    path = write(tmp_path / "disque.conf", "# hello\n\nport 7711\n  loglevel   NOTICE\n\n\n")
    Config.load(str(path), []).rewrite()
    assert path.read_text() == "# hello\n\nport 7711\n  loglevel   NOTICE\n\n\n"


def test_rewrite_updates_dedups_and_appends(tmp_path: Path) -> None:
    config, path = rewrite_case(tmp_path)
    config.config_set("appendonly", "yes")
    config.config_set("maxmemory-policy", "noeviction")
    config.rewrite()
    assert path.read_text() == (
        "# Disque configuration file\n"
        "\n"
        "# Network\n"
        "port 7711\n"
        "bind 127.0.0.1\n"
        "\n"
        "# Memory\n"
        "maxmemory 2gb\n"
        "include extra.conf\n"
        "\n"
        "# Persistence\n"
        "appendonly yes\n"
        "appendfsync everysec\n"
        f"{REWRITE_SIGNATURE}\n"
        "timeout 30\n"
        "maxmemory-policy noeviction\n"
        "hz 20\n"
    )


def test_rewrite_is_idempotent(tmp_path: Path) -> None:
    config, path = rewrite_case(tmp_path)
    config.config_set("requirepass", 'quote " and space')
    config.rewrite()
    first = path.read_text()
    config.rewrite()
    assert path.read_text() == first
    Config.load(str(path), []).rewrite()
    assert path.read_text() == first
    assert first.count(REWRITE_SIGNATURE) == 1


def test_rewrite_appends_under_an_existing_signature(tmp_path: Path) -> None:
    path = write(tmp_path / "disque.conf", f"port 7711\n{REWRITE_SIGNATURE}\nhz 20\n")
    config = Config.load(str(path), [])
    config.config_set("timeout", "5")
    config.rewrite()
    assert path.read_text() == f"port 7711\n{REWRITE_SIGNATURE}\nhz 20\ntimeout 5\n"


def test_rewrite_writes_a_default_value_in_place(tmp_path: Path) -> None:
    path = write(tmp_path / "disque.conf", "# t\ntimeout 30\n")
    config = Config.load(str(path), [])
    config.config_set("timeout", "0")
    config.rewrite()
    assert path.read_text() == "# t\ntimeout 0\n"


def test_rewrite_comments_out_lines_it_cannot_parse(tmp_path: Path) -> None:
    path = write(tmp_path / "disque.conf", "port 7711\n")
    config = Config.load(str(path), [])
    write(path, 'port 7711\nrequirepass "oops\n')
    config.rewrite()
    assert path.read_text() == 'port 7711\n# ??? requirepass "oops\n'


def test_rewrite_recreates_a_deleted_file(tmp_path: Path) -> None:
    path = write(tmp_path / "disque.conf", "port 7711\n")
    config = Config.load(str(path), [])
    path.unlink()
    config.rewrite()
    assert path.read_text() == ""
    config.config_set("hz", "25")
    config.rewrite()
    assert path.read_text() == f"{REWRITE_SIGNATURE}\nhz 25\n"


def test_rewrite_keeps_mode_follows_symlinks_and_leaves_no_temp(tmp_path: Path) -> None:
    real = write(tmp_path / "real.conf", "port 7711\n")
    real.chmod(0o640)
    link = tmp_path / "disque.conf"
    link.symlink_to(real)
    config = Config.load(str(link), [])
    config.config_set("hz", "30")
    config.rewrite()
    assert link.is_symlink()
    assert real.read_text() == f"port 7711\n{REWRITE_SIGNATURE}\nhz 30\n"
    assert stat.S_IMODE(real.stat().st_mode) == 0o640
    assert sorted(os.listdir(tmp_path)) == ["disque.conf", "real.conf"]


def test_rewrite_io_error(tmp_path: Path) -> None:
    path = write(tmp_path / "disque.conf", "port 7711\n")
    config = Config.load(str(path), [])
    config.path = str(tmp_path / "missing-dir" / "disque.conf")
    with pytest.raises(ConfigError, match=r"^Rewriting config file: "):
        config.rewrite()


# --------------------------------------------------------------------------
# Properties: load -> set -> rewrite -> load
# --------------------------------------------------------------------------

_WORD = st.text(
    st.characters(exclude_categories=["Cs", "Cc", "Zs", "Zl", "Zp"]), min_size=1, max_size=12
)
# Any text, or bytes that are not UTF-8 as a file or RESP would hand them over.
_TEXT = st.text(max_size=30) | st.binary(max_size=30).map(
    lambda raw: raw.decode("utf-8", "surrogateescape")
)


def values_for(kind: Any) -> st.SearchStrategy[Any]:
    """Valid typed values of one kind of directive."""
    if isinstance(kind, IntKind):
        return st.integers(max(kind.low, -(2**40)), min(kind.high, 2**40))
    if isinstance(kind, MemoryKind):
        return st.integers(kind.low, 2**40)
    if isinstance(kind, BoolKind):
        return st.booleans()
    if isinstance(kind, EnumKind):
        return st.sampled_from(kind.choices)
    if isinstance(kind, StringKind):
        return _TEXT
    if isinstance(kind, PathKind):
        bad = "\0/\\" if kind.basename_only else "\0"
        return _TEXT.filter(lambda path: not any(c in path for c in bad))
    if isinstance(kind, OctalKind):
        return st.integers(0, 0o777)
    if isinstance(kind, WordsKind):
        return st.lists(_WORD, min_size=kind.min_count, max_size=4).map(tuple)
    if isinstance(kind, OutputBufferLimitKind):
        sizes = st.integers(0, 2**40)
        return st.builds(OutputBufferLimit, sizes, sizes, st.integers(0, 3600))
    assert isinstance(kind, PortOrAutoKind)
    return st.none() | st.integers(0, 65535)


def settings_of(directives: list[Any]) -> st.SearchStrategy[list[tuple[Any, Any]]]:
    pair = st.sampled_from(directives).flatmap(lambda d: st.tuples(st.just(d), values_for(d.kind)))
    return st.lists(pair, max_size=12)


# The port is kept low enough for the derived bus and web ports to exist;
# tls-port is left out for the same reason (with port 0 they derive from it).
_FILE_DIRECTIVES = [d for d in DIRECTIVES.values() if d.name not in ("port", "tls-port")]
_MUTABLE = [d for d in DIRECTIVES.values() if d.mutable]


@settings(max_examples=150, deadline=None)
@given(
    file_settings=settings_of(_FILE_DIRECTIVES),
    port=st.integers(0, 55535),
    comments=st.lists(
        st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\n\r"), max_size=10)
    ),
    changes=settings_of(_MUTABLE),
)
def test_load_set_rewrite_load_gives_the_same_values(
    file_settings: list[tuple[Any, Any]],
    port: int,
    comments: list[str],
    changes: list[tuple[Any, Any]],
) -> None:
    lines = [f"port {port}"] + [d.line(value) for d, value in file_settings]
    lines[1:1] = ["#" + c for c in comments]
    with tempfile.TemporaryDirectory() as tmp:
        path = write(Path(tmp) / "disque.conf", "\n".join(lines) + "\n")
        config = Config.load(str(path), [])
        last = {directive.name: value for directive, value in file_settings}
        assert {name: config.get(name) for name in last} == last
        for directive, value in changes:
            config.config_set(directive.name, directive.kind.show(value))
        config.rewrite()
        rewritten = path.read_text(encoding="utf-8")
        reloaded = Config.load(str(path), [])
        assert reloaded.values() == config.values()
        kept = [line for line in rewritten.split("\n") if line.startswith("#")]
        assert kept[: len(comments)] == ["#" + c for c in comments]
        reloaded.rewrite()
        assert path.read_text(encoding="utf-8") == rewritten


def test_bytes_that_are_not_utf8_survive_a_rewrite(tmp_path: Path) -> None:
    path = tmp_path / "disque.conf"
    path.write_bytes(b"# caf\xe9\nrequirepass p\xff\n")
    config = Config.load(str(path), [])
    assert config.requirepass == "p\udcff"
    config.config_set("timeout", "1")
    config.rewrite()
    assert path.read_bytes() == (
        b"# caf\xe9\nrequirepass p\xff\n" + REWRITE_SIGNATURE.encode() + b"\ntimeout 1\n"
    )
    config.config_set("requirepass", "q\udcfe")
    config.rewrite()
    assert b'requirepass "q\\xfe"\n' in path.read_bytes()
    assert Config.load(str(path), []).requirepass == "q\udcfe"


def test_usage_names_the_program() -> None:
    text = usage("dq")
    assert text.startswith("Usage: dq [/path/to/disque.conf] [options]\n")
    assert "dq --port 7777" in text


# --------------------------------------------------------------------------
# TLS directives
# --------------------------------------------------------------------------


def test_tls_defaults() -> None:
    config = Config()
    assert config.tls_port == 0
    assert (config.tls_cert_file, config.tls_key_file, config.tls_key_file_pass) == ("", "", "")
    assert config.tls_ca_cert_file == ""
    # Redis' default is yes; ours is no (see the field's comment).
    assert config.tls_auth_clients == "no"
    assert config.tls_cluster is False and config.tls_web is False


def test_tls_directives_parse(tmp_path: Path) -> None:
    config = load_text(
        tmp_path,
        "tls-port 7712\ntls-cert-file /etc/disque/node.crt\ntls-key-file node.key\n"
        'tls-key-file-pass "two words"\ntls-ca-cert-file ca.crt\n'
        "tls-auth-clients OPTIONAL\ntls-cluster yes\ntls-web yes\n",
    )
    assert config.tls_port == 7712
    assert config.tls_cert_file == "/etc/disque/node.crt"
    assert config.tls_key_file_pass == "two words"
    assert config.tls_auth_clients == "optional"
    assert config.tls_cluster is True and config.tls_web is True
    assert "'tls-auth-clients' value 'maybe': must be one of no, optional, yes" in load_error(
        tmp_path, "tls-auth-clients maybe\n"
    )
    assert "between 0 and 65535" in load_error(tmp_path, "tls-port 70000\n")


@pytest.mark.parametrize("name", ["tls-port", "tls-cert-file", "tls-cluster", "tls-web"])
def test_tls_directives_are_not_config_settable(name: str) -> None:
    with pytest.raises(ConfigError, match=f"Unsupported CONFIG parameter: {name}"):
        Config().config_set(name, "1")


def test_derived_ports_of_a_tls_only_node(tmp_path: Path) -> None:
    config = load_text(tmp_path, "port 0\ntls-port 7000\n")
    assert config.base_port() == 7000
    assert (config.cluster_bus_port(), config.web_listen_port()) == (17000, 8000)
    # With a plain port, the derived ports follow it, whatever tls-port is.
    config = load_text(tmp_path, "port 7100\ntls-port 7000\n")
    assert (config.base_port(), config.cluster_bus_port(), config.web_listen_port()) == (
        7100,
        17100,
        8100,
    )
    assert "tls-port 60000 leaves no room for the cluster bus" in load_error(
        tmp_path, "port 0\ntls-port 60000\n"
    )
