"""server/tls.py: the SSL contexts built from the tls-* directives, the
one-line errors for bad files, and handshakes over in-memory streams
(certificates from tests/tlscerts.py; skipped without ``openssl``)."""

from __future__ import annotations

import ssl
from pathlib import Path

import h11
import pytest
import trio
import trio.testing

from disque_trio.config import Config, ConfigError
from disque_trio.server import tls
from disque_trio.server.node import NodeServer
from disque_trio.server.tls import TlsContexts, TlsHandshakeError

from ..helpers import virtual_env
from ..tlscerts import KEY_PASSWORD, Pki, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def config(pki: Pki | None = None, **directives: str) -> Config:
    pairs = [(k.replace("_", "-"), [v]) for k, v in directives.items()]
    if pki is not None:
        pairs = [("tls-cert-file", [pki.cert]), ("tls-key-file", [pki.key]), *pairs]
    return Config.load(None, pairs)


def error(cfg: Config) -> str:
    with pytest.raises(ConfigError) as info:
        TlsContexts.from_config(cfg)
    return str(info.value)


def test_off_reads_nothing() -> None:
    # Files named but TLS off: nothing is read, nothing built.
    contexts = TlsContexts.from_config(config(tls_cert_file="/nonexistent/cert.pem"))
    assert contexts == TlsContexts()
    assert contexts.web_context is None


def test_tls_port_builds_the_client_context_only(pki: Pki) -> None:
    contexts = TlsContexts.from_config(config(pki, tls_port="7712"))
    assert contexts.clients is not None and contexts.clients.verify_mode == ssl.CERT_NONE
    assert contexts.clients.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert (contexts.bus_server, contexts.bus_client, contexts.web_context) == (None, None, None)


@pytest.mark.parametrize(
    ("auth", "mode"),
    [("no", ssl.CERT_NONE), ("optional", ssl.CERT_OPTIONAL), ("yes", ssl.CERT_REQUIRED)],
)
def test_tls_auth_clients(pki: Pki, auth: str, mode: ssl.VerifyMode) -> None:
    cfg = config(pki, tls_port="7712", tls_auth_clients=auth, tls_ca_cert_file=pki.ca)
    contexts = TlsContexts.from_config(cfg)
    assert contexts.clients is not None and contexts.clients.verify_mode == mode


def test_tls_web_alone(pki: Pki) -> None:
    contexts = TlsContexts.from_config(config(pki, tls_web="yes"))
    assert contexts.web and contexts.web_context is contexts.clients is not None


def test_tls_cluster_checks_both_ends(pki: Pki) -> None:
    contexts = TlsContexts.from_config(config(pki, tls_cluster="yes", tls_ca_cert_file=pki.ca))
    assert contexts.clients is None
    assert contexts.bus_server is not None and contexts.bus_server.verify_mode == ssl.CERT_REQUIRED
    assert contexts.bus_client is not None and contexts.bus_client.verify_mode == ssl.CERT_REQUIRED
    assert contexts.bus_client.check_hostname is False  # peers are dialled by IP


def test_encrypted_key(pki: Pki) -> None:
    enc = pki.path("node-enc.key")
    good = config(pki, tls_port="1", tls_key_file=enc, tls_key_file_pass=KEY_PASSWORD)
    assert TlsContexts.from_config(good).clients is not None
    wrong = config(pki, tls_port="1", tls_key_file=enc, tls_key_file_pass="nope")
    assert error(wrong) == f"tls-key-file '{enc}' is encrypted and tls-key-file-pass is wrong"
    unset = config(pki, tls_port="1", tls_key_file=enc)
    assert error(unset) == f"tls-key-file '{enc}' is encrypted and tls-key-file-pass is not set"


def test_bad_files(pki: Pki, tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    assert error(config(pki, tls_port="1", tls_cert_file=str(junk))) == (
        f"tls-cert-file '{junk}' holds no PEM certificate"
    )
    assert error(config(pki, tls_port="1", tls_key_file=pki.cert)) == (
        f"tls-key-file '{pki.cert}' holds no PEM private key"
    )
    assert error(config(pki, tls_port="1", tls_key_file=pki.path("client.key"))) == (
        f"tls-key-file '{pki.path('client.key')}' is not the key of tls-cert-file '{pki.cert}'"
    )
    assert error(config(pki, tls_cluster="yes", tls_ca_cert_file=str(junk))) == (
        f"tls-ca-cert-file '{junk}' holds no PEM certificate"
    )
    assert error(config(pki, tls_port="1", tls_cert_file=str(tmp_path))) == (
        f"Can't read tls-cert-file '{tmp_path}': Is a directory"
    )
    missing = tmp_path / "missing.key"
    assert error(config(pki, tls_port="1", tls_key_file=str(missing))) == (
        f"Can't read tls-key-file '{missing}': No such file or directory"
    )


def test_missing_directives(pki: Pki) -> None:
    assert error(config(tls_port="1")) == "tls-port needs tls-cert-file and tls-key-file"
    assert error(config(tls_web="yes", tls_cluster="yes", tls_key_file=pki.key)) == (
        "tls-web and tls-cluster need tls-cert-file"
    )
    assert error(config(pki, tls_cluster="yes")).startswith(
        "tls-cluster yes needs tls-ca-cert-file"
    )
    assert error(config(pki, tls_web="yes", tls_auth_clients="optional")).startswith(
        "tls-auth-clients optional needs tls-ca-cert-file"
    )
    # Client certificates matter only where clients connect over TLS.
    assert TlsContexts.from_config(config(pki, tls_auth_clients="yes")) == TlsContexts()


# ------------------------------------------------------------- handshakes


async def _pair(
    server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext
) -> tuple[tls.TlsStream, tls.TlsStream]:
    """Both ends of a handshake over memory streams; raises TlsHandshakeError
    (from either end)."""
    left, right = trio.testing.memory_stream_pair()
    ends: dict[str, tls.TlsStream] = {}

    async def serve() -> None:
        ends["server"] = await tls.accept(right, server_ctx)

    async def dial() -> None:
        ends["client"] = await tls.connect(left, client_ctx)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        nursery.start_soon(dial)
    return ends["server"], ends["client"]


def _bus(pki: Pki, cert: str = "node", ca: str = "ca") -> TlsContexts:
    cfg = config(
        tls_cluster="yes",
        tls_cert_file=pki.path(f"{cert}.crt"),
        tls_key_file=pki.path(f"{cert}.key"),
        tls_ca_cert_file=pki.path(f"{ca}.crt"),
    )
    return TlsContexts.from_config(cfg)


async def test_bus_ends_handshake_and_carry_data(pki: Pki) -> None:
    a, b = _bus(pki), _bus(pki)
    assert a.bus_server is not None and b.bus_client is not None
    server, client = await _pair(a.bus_server, b.bus_client)
    await client.send_all(b"frame")
    assert await server.receive_some(100) == b"frame"
    assert server.getpeercert() and client.getpeercert()


async def test_bus_refuses_a_certificate_of_another_ca(pki: Pki) -> None:
    ours, theirs = _bus(pki), _bus(pki, cert="stranger", ca="other-ca")
    assert ours.bus_server is not None and theirs.bus_client is not None
    with pytest.raises(ExceptionGroup) as info:
        await _pair(ours.bus_server, theirs.bus_client)
    assert info.group_contains(TlsHandshakeError, match="certificate verify failed|unknown ca")


async def test_plain_text_fails_the_handshake(pki: Pki) -> None:
    contexts = TlsContexts.from_config(config(pki, tls_port="1"))
    assert contexts.clients is not None
    left, right = trio.testing.memory_stream_pair()
    await left.send_all(b"PING\r\n")
    with pytest.raises(TlsHandshakeError):
        await tls.accept(right, contexts.clients)


async def test_a_silent_peer_times_out(pki: Pki, autojump_clock: trio.testing.MockClock) -> None:
    contexts = TlsContexts.from_config(config(pki, tls_port="1"))
    assert contexts.clients is not None
    _, right = trio.testing.memory_stream_pair()
    started = trio.current_time()
    with pytest.raises(TlsHandshakeError, match="no TLS handshake within 5 s"):
        await tls.accept(right, contexts.clients)
    assert trio.current_time() - started == pytest.approx(tls.HANDSHAKE_TIMEOUT_S)


def test_unwrap_finds_the_transport(pki: Pki) -> None:
    contexts = TlsContexts.from_config(config(pki, tls_port="1"))
    assert contexts.clients is not None
    raw, _ = trio.testing.memory_stream_pair()
    wrapped = trio.SSLStream(raw, contexts.clients, server_side=True)
    assert tls.unwrap(wrapped) is raw and tls.unwrap(raw) is raw


@pytest.mark.parametrize(
    ("web_tls", "origin", "host", "allowed"),
    [
        (True, "https://disque.example", "disque.example", True),  # both 443
        (True, "https://disque.example", "disque.example:443", True),
        (True, "http://disque.example", "disque.example", False),  # 80 vs 443
        (False, "http://disque.example", "disque.example", True),  # both 80
        (False, "https://disque.example", "disque.example", False),
    ],
)
async def test_origin_rule_knows_the_https_default_port(
    web_tls: bool, origin: str, host: str, allowed: bool
) -> None:
    """With tls-web, a Host header without a port means 443, as the
    browser's https:// Origin does."""
    server = NodeServer(
        Config(), virtual_env(), persist_cluster=False, tls_contexts=TlsContexts(web=web_tls)
    )
    request = h11.Request(method="GET", target="/ws", headers=[("Host", host), ("Origin", origin)])
    assert server.web.origin_allowed(request) is allowed
