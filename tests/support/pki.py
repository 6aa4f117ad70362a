"""Throwaway certificates for the TLS tests, made with the openssl command line.

A CA, a server certificate for 127.0.0.1 and localhost, a client certificate
whose private key is encrypted with :data:`KEY_PASSWORD` (mutual TLS), and a
second CA that signed none of them (the wrong-CA tests).

The server certificate names IP 127.0.0.1 (subjectAltName IP:127.0.0.1):
kafka-python checks the host name by default (``ssl_check_hostname``), and
after bootstrapping it connects to the host the metadata advertises, here the
IP. A certificate for ``localhost`` only fails there ("IP address mismatch").
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

KEY_PASSWORD = "a pass phrase for the client key"


@dataclass(frozen=True)
class Pki:
    ca: Path  # signed the server and client certificates
    server_cert: Path
    server_key: Path  # PKCS#8, not encrypted
    client_cert: Path
    client_key: Path  # encrypted with KEY_PASSWORD
    other_ca: Path  # a CA that signed nothing here


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)}:\n{result.stderr}")


def _ca(directory: Path, name: str) -> None:
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.pem",
        "-days",
        "2",
        "-subj",
        f"/CN=perceptron-stream test {name}",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )


def _signed(directory: Path, name: str, subject: str, extensions: str, key_password: str | None = None) -> None:
    key = ["-passout", f"pass:{key_password}"] if key_password else ["-nodes"]
    _openssl(
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        *key,
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        "-subj",
        subject,
        cwd=directory,
    )
    (directory / f"{name}.ext").write_text(extensions)
    _openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        f"{name}.pem",
        "-days",
        "2",
        "-extfile",
        f"{name}.ext",
        cwd=directory,
    )


def make_pki(directory: Path) -> Pki:
    """Every certificate and key in ``directory`` (which must exist)."""
    _ca(directory, "ca")
    _ca(directory, "other-ca")
    _signed(
        directory,
        "server",
        "/CN=localhost",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    _signed(
        directory,
        "client",
        "/CN=perceptron-stream",
        "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
        key_password=KEY_PASSWORD,
    )
    return pki_in(directory)


def pki_in(directory: Path) -> Pki:
    """The files :func:`make_pki` made in ``directory``."""
    return Pki(
        directory / "ca.pem",
        directory / "server.pem",
        directory / "server.key",
        directory / "client.pem",
        directory / "client.key",
        directory / "other-ca.pem",
    )
