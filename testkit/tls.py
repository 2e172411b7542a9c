"""Certificates for TLS tests and benchmarks, generated with ``cryptography`` (never
committed).

:func:`make_certs` writes, under a directory it is given, PEM files of:

* ``ca``: a self-signed CA;
* ``broker``: a server (and client) certificate signed by ``ca`` with SANs ``localhost``
  and ``127.0.0.1`` (so every broker of a test on loopback can share it);
* ``client``: a client certificate signed by ``ca`` (for mutual TLS);
* ``other``: a CA and a broker certificate of its own (a certificate from another CA);
* ``expired``: a broker certificate signed by ``ca`` whose validity ended yesterday;
* ``wrong_host``: a broker certificate signed by ``ca`` for ``elsewhere.invalid`` only;
* ``encrypted_key``: ``broker``'s key encrypted with :data:`KEY_PASSWORD`;
* ``ca_key``: the CA's key, for :func:`issue_client` (client certificates with a subject
  of the test's choosing, e.g. for ``ssl.principal.mapping.rules``).

:class:`SecureZooKeeperServer` is a real ZooKeeper serving TLS with these certificates.

Keys are EC P-256: generating them costs milliseconds, where RSA would cost a second each.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from testkit.zookeeper import ZooKeeperServer, free_loopback_port

KEY_PASSWORD = "broker-key-secret"


@dataclass(frozen=True)
class CertFiles:
    """One certificate and its key, as PEM files."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class TlsCerts:
    """The files of :func:`tls_certs`; ``ca`` and ``other_ca`` are certificate files."""

    ca: Path
    broker: CertFiles
    client: CertFiles
    other_ca: Path
    other: CertFiles
    expired: CertFiles
    wrong_host: CertFiles
    encrypted_key: Path  # broker.key encrypted with KEY_PASSWORD
    ca_key: Path

    def broker_keys(self, *, client_auth: str = "none") -> dict[str, str]:
        """A broker's TLS keys with the shared broker certificate (inter-broker TLS too)."""
        return {
            "security.protocol": "SSL",
            "ssl.ca.location": str(self.ca),
            "ssl.certificate.location": str(self.broker.cert),
            "ssl.key.location": str(self.broker.key),
            "ssl.client.auth": client_auth,
        }

    def client_keys(self, *, with_cert: bool = False) -> dict[str, str]:
        """A client's TLS keys trusting ``ca``, with the client certificate if asked."""
        keys = {"security.protocol": "SSL", "ssl.ca.location": str(self.ca)}
        if with_cert:
            keys["ssl.certificate.location"] = str(self.client.cert)
            keys["ssl.key.location"] = str(self.client.key)
        return keys


def _name(common_name: str | x509.Name) -> x509.Name:
    if isinstance(common_name, x509.Name):
        return common_name
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey, password: str | None = None) -> None:
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password.encode())
        if password
        else serialization.NoEncryption()
    )
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    )
    path.chmod(0o600)


def _issue(
    subject: str | x509.Name,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool = False,
    hosts: tuple[str, ...] = (),
    client: bool = False,
    days: tuple[int, int] = (-1, 365),
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, issuer_key = issuer if issuer is not None else (_name(subject), key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now + datetime.timedelta(days=days[0]))
        .not_valid_after(now + datetime.timedelta(days=days[1]))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if hosts:
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    if not ca:
        # A broker's certificate is also its client certificate to other brokers.
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
        if not client:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    return builder.sign(issuer_key, hashes.SHA256()), key


def _write(
    directory: Path, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> CertFiles:
    files = CertFiles(directory / f"{name}.crt", directory / f"{name}.key")
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(files.key, key)
    return files


def make_certs(directory: Path) -> TlsCerts:
    """Write the whole set of :class:`TlsCerts` into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = _issue("idemlog test CA", None, ca=True)
    ca = (ca_cert.subject, ca_key)
    loopback = ("localhost", "127.0.0.1")
    other_cert, other_key = _issue("another CA", None, ca=True)
    broker_cert, broker_key = _issue("broker", ca, hosts=loopback)
    certs = TlsCerts(
        ca=directory / "ca.crt",
        broker=_write(directory, "broker", broker_cert, broker_key),
        client=_write(directory, "client", *_issue("client", ca, client=True)),
        other_ca=directory / "other-ca.crt",
        other=_write(
            directory, "other", *_issue("broker", (other_cert.subject, other_key), hosts=loopback)
        ),
        expired=_write(directory, "expired", *_issue("broker", ca, hosts=loopback, days=(-30, -1))),
        wrong_host=_write(
            directory, "wrong-host", *_issue("broker", ca, hosts=("elsewhere.invalid",))
        ),
        encrypted_key=directory / "broker-encrypted.key",
        ca_key=directory / "ca.key",
    )
    _write_key(certs.ca_key, ca_key)
    certs.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    certs.other_ca.write_bytes(other_cert.public_bytes(serialization.Encoding.PEM))
    _write_key(certs.encrypted_key, broker_key, KEY_PASSWORD)
    return certs


def issue_client(
    certs: TlsCerts, name: str, subject: x509.Name, *, days: tuple[int, int] = (-1, 365)
) -> CertFiles:
    """A client certificate for ``subject`` signed by ``certs.ca``, written beside it as
    ``<name>.crt``/``<name>.key``; ``days``: its validity relative to today."""
    ca_cert = x509.load_pem_x509_certificate(certs.ca.read_bytes())
    ca_key = serialization.load_pem_private_key(certs.ca_key.read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    cert, key = _issue(subject, (ca_cert.subject, ca_key), client=True, days=days)
    return _write(certs.ca.parent, name, cert, key)


# -- ZooKeeper with TLS ------------------------------------------------------------------
# The Netty jars ZooKeeper's secure port needs beyond the Debian manifest's Class-Path.
_NETTY_JARS = (
    "netty-codec",
    "netty-handler",
    "netty-buffer",
    "netty-common",
    "netty-transport",
    "netty-resolver",
    "netty-transport-native-epoll",
    "netty-transport-native-unix-common",
)


def with_netty(command: list[str]) -> list[str]:
    """A ZooKeeper server's ``command`` with Debian's Netty jars (those installed) added to
    its class path: its TLS port needs Netty's connection factory."""
    at = command.index("-cp") + 1
    extra = [f"/usr/share/java/{name}.jar" for name in _NETTY_JARS]
    command[at] = os.pathsep.join([command[at], *(j for j in extra if Path(j).exists())])
    return command


def append_tls_config(
    config_path: Path, base_dir: Path, server: CertFiles, ca: Path, address: str, port: int
) -> None:
    """Append to a ZooKeeper server's configuration its TLS port ``address:port`` (Netty,
    ``server``'s key and certificate as a 0600 PEM store in ``base_dir``) trusting ``ca``
    and requiring a client certificate (``ssl.clientAuth=need``)."""
    keystore = base_dir / "zk-keystore.pem"  # ZooKeeper's PEM store: key then cert
    keystore.write_bytes(server.key.read_bytes() + server.cert.read_bytes())
    keystore.chmod(0o600)
    lines = [
        f"secureClientPort={port}",
        f"secureClientPortAddress={address}",
        "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
        f"ssl.keyStore.location={keystore}",
        "ssl.keyStore.type=PEM",
        f"ssl.trustStore.location={ca}",
        "ssl.trustStore.type=PEM",
        "ssl.clientAuth=need",
    ]
    with config_path.open("a", encoding="utf-8") as config:
        config.write("\n".join(lines) + "\n")


class SecureZooKeeperServer(ZooKeeperServer):
    """A ZooKeeper server that also serves TLS on ``secure_port`` (Netty, PEM files,
    ``ssl.clientAuth=need``: a client must show a certificate of ``certs.ca``). The plain
    port stays open for the harness's readiness probe only."""

    def __init__(self, base_dir: Path, certs: TlsCerts) -> None:
        super().__init__(base_dir)
        self.certs = certs
        self.secure_port = free_loopback_port()

    @property
    def secure_address(self) -> str:
        return f"127.0.0.1:{self.secure_port}"

    def command(self) -> list[str]:
        return with_netty(super().command())

    def _write_config(self) -> None:
        super()._write_config()
        append_tls_config(
            self.config_path,
            self.base_dir,
            self.certs.broker,
            self.certs.ca,
            "127.0.0.1",
            self.secure_port,
        )
