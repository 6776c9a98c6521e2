"""Throwaway certificates for the TLS tests, made with the ``openssl``
command line (the tests that need them skip when it is not installed).

:func:`make_pki` writes, in one directory:

- ``ca.crt``/``ca.key``: a test CA;
- ``node.crt``/``node.key``: signed by it, for ``localhost`` and
  ``127.0.0.1``, good as a server and as a client certificate (a node
  presents it on both ends of a bus link);
- ``node-enc.key``: the same key encrypted with ``KEY_PASSWORD``;
- ``client.crt``/``client.key``: a client certificate signed by the CA;
- ``other-ca.crt`` and ``stranger.crt``/``stranger.key``: another CA and a
  certificate it signed, which the nodes must refuse.

Elliptic-curve keys: generating them takes milliseconds.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import attrs
import pytest

KEY_PASSWORD = "s3cret-key-pass"
DAYS = "2"
_LEAF_EXTENSIONS = """\
[leaf]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = DNS:localhost, IP:127.0.0.1
"""
_CA_CONFIG = """\
[req]
distinguished_name = dn
x509_extensions = ca
prompt = no
[dn]
CN = placeholder
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
"""


@attrs.frozen
class Pki:
    dir: Path

    def path(self, name: str) -> str:
        return str(self.dir / name)

    @property
    def ca(self) -> str:
        return self.path("ca.crt")

    @property
    def cert(self) -> str:
        return self.path("node.crt")

    @property
    def key(self) -> str:
        return self.path("node.key")

    def node_args(self) -> list[str]:
        """Command-line directives naming the node's certificate, key and CA."""
        return ["--tls-cert-file", self.cert, "--tls-key-file", self.key]


def openssl_or_skip() -> str:
    found = shutil.which("openssl")
    if found is None:
        pytest.skip("the openssl command line is not installed")
    return found


def make_pki(directory: Path) -> Pki:
    openssl = openssl_or_skip()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "ca.cnf").write_text(_CA_CONFIG)
    (directory / "leaf.cnf").write_text(_LEAF_EXTENSIONS)

    def run(*args: str) -> None:
        subprocess.run(
            [openssl, *args], cwd=directory, check=True, capture_output=True, timeout=60
        )

    def new_ca(name: str, cn: str) -> None:
        run(
            "req", "-x509", "-config", "ca.cnf", "-newkey", "ec",
            "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", DAYS,
            "-subj", f"/CN={cn}", "-keyout", f"{name}.key", "-out", f"{name}.crt",
        )  # fmt: skip

    def new_leaf(name: str, ca: str, serial: int) -> None:
        run(
            "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.csr",
        )  # fmt: skip
        run(
            "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
            "-set_serial", str(serial), "-days", DAYS, "-extfile", "leaf.cnf",
            "-extensions", "leaf", "-out", f"{name}.crt",
        )  # fmt: skip

    new_ca("ca", "disque-trio test CA")
    new_ca("other-ca", "another CA")
    new_leaf("node", "ca", 1001)
    new_leaf("client", "ca", 1002)
    new_leaf("stranger", "other-ca", 1003)
    run(
        "pkey", "-in", "node.key", "-aes-256-cbc", "-passout", f"pass:{KEY_PASSWORD}",
        "-out", "node-enc.key",
    )  # fmt: skip
    return Pki(directory)
