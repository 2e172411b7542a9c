"""The secured variant of the multi-host stack (``tests/cluster/stack.py``): issue 25's
secured cluster, every security setting in one place, :class:`Security`.

* a CA of the run and a certificate per host naming the host's private address (brokers'
  and ZooKeeper's, usable as server and client certificates), a client certificate per
  user (``CN=<user>``);
* brokers with ``security.protocol=SASL_SSL`` and ``ssl.client.auth=required``: TLS with
  client certificates on every link (clients to brokers, broker to broker), SCRAM on
  every connection, the brokers authenticating to each other as ``User:broker``
  (``sasl.inter.broker.*``);
* ZooKeeper serving TLS only to the network (its ``secureClientPort``, ``ssl.clientAuth=
  need``), the brokers connecting with ``zookeeper.ssl.*``; its plaintext port is on the
  ZooKeeper host's loopback, for the readiness probe and the operator's ``idemlog users``
  run on that host (:class:`SecuredZooKeeper`);
* the SCRAM users ``broker``, ``writer`` (the Spark job's) and ``reader`` (``spark.read``
  and the verifying reader) added before any broker starts;
* the authorizer on (``authorizer.enable``, ``super.users=User:broker``), with only the
  documented minimal ACLs of a writing and a reading job granted (:meth:`Security.grant`,
  docs/security.md "The minimal ACLs of a job");
* ZooKeeper node ACLs on (``zookeeper.set.acl``, the brokers' digest identity
  ``zookeeper.auth.digest.*``), the tree under the chroot :data:`ZK_CHROOT`, so that every
  idemlog node has an idemlog parent; the operator's ``idemlog users|acls`` run with
  ``--config`` and the identity (:meth:`Security.zookeeper_config`);
* the Spark job's options (:meth:`Security.client_keys`): the files are on the one
  filesystem the hosts share, so the driver and every executor read the same paths.

Where each piece is set: :attr:`Security.broker_extra` (the authorizer's and ZooKeeper
ACLs' broker keys, filled by :meth:`Security.create`), :meth:`Security.before_brokers`
(what ZooKeeper holds before a broker starts) and :meth:`Security.grant` (the ACLs).
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from broker_core.client.broker_client import BrokerClient
from broker_core.security.flight_auth import SaslCredentials
from broker_core.security.scram import Mechanism
from broker_core.security.tls import Side, TlsMaterial, TlsSettings
from testkit.tls import CertFiles, _issue, _write, append_tls_config, with_netty
from testkit.zookeeper import LOOPBACK, ZooKeeperServer
from tests.harness.cluster import REPO, ZK_PORT
from tests.harness.netns import Host

if TYPE_CHECKING:
    from tests.cluster.stack import Stack

PROTOCOL = "SASL_SSL"
MECHANISM = Mechanism.SCRAM_SHA_512
# ZooKeeper's plaintext port, bound to the ZooKeeper host's loopback: no other host
# reaches it (the network gets ZK_PORT, TLS only).
ZK_LOOPBACK_PORT = 2182
# The tests' topics start with it, so that ACLs can be granted on the prefix.
TOPIC_PREFIX = "sec_"
# The brokers' ZooKeeper chroot: with none, /idemlog and /latest_producer_id_block would
# hang under ZooKeeper's root, open to all, so anyone could delete the latter (delete is
# checked on the parent's ACL; docs/security.md, "A secured cluster, tested").
ZK_CHROOT = "/idemlog-secured"
ZK_USER = "idemlog-brokers"  # the brokers' ZooKeeper digest identity
# The stream's query id, hence its sink id, fixed by the checkpoint's metadata written
# before its first start (fix_query_id), so that its ACL can be granted beforehand.
STREAM_QUERY_ID = "5ec0e2d5-25a1-4c3e-9a7b-0000000000c1"
BATCH_PREFIX = "batch-"  # every df.write job's sink id: batch-<run id>


def idemlog_on(
    host: Host | None, args: Sequence[str], *, stdin: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """The real ``idemlog`` command, as an operator runs it, on ``host`` (None: the test
    process's own namespace, which reaches every host through the bridge)."""
    argv = [sys.executable, "-m", "broker_core.cli.main", *args]
    return subprocess.run(
        host.command(argv) if host is not None else argv,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        check=False,
    )


def fix_query_id(checkpoint: Path, query_id: str = STREAM_QUERY_ID) -> None:
    """Write ``checkpoint``'s ``metadata`` before the query's first start: Spark takes the
    query id (the sink id) from it (docs/security.md, "The minimal ACLs of a job")."""
    checkpoint.mkdir(parents=True, exist_ok=True)
    (checkpoint / "metadata").write_text(json.dumps({"id": query_id}) + "\n")


class SecuredZooKeeper(ZooKeeperServer):
    """ZooKeeper on ``host``: TLS on ``host.address:ZK_PORT`` with a certificate naming
    that address and client certificates required (``ssl.clientAuth=need``); plaintext
    only on the host's loopback (``ZK_LOOPBACK_PORT``), probed from inside the host."""

    def __init__(self, base_dir: Path, host: Host, cert: CertFiles, ca: Path) -> None:
        super().__init__(base_dir, host=LOOPBACK, port=ZK_LOOPBACK_PORT, launcher=host.command)
        self.bed_host = host
        self.cert = cert
        self.ca = ca

    @property
    def loopback_connect(self) -> str:
        """``zookeeper.connect`` (the brokers' chroot) for a command run on the ZooKeeper
        host itself."""
        return f"{LOOPBACK}:{ZK_LOOPBACK_PORT}{ZK_CHROOT}"

    @property
    def network_address(self) -> str:
        """Where the network reaches ZooKeeper (TLS only), without the chroot."""
        return f"{self.bed_host.address}:{ZK_PORT}"

    def command(self) -> list[str]:
        return with_netty(super().command())

    def _write_config(self) -> None:
        super()._write_config()
        append_tls_config(
            self.config_path, self.base_dir, self.cert, self.ca, self.bed_host.address, ZK_PORT
        )

    def _serving(self) -> bool:
        # The plaintext port is the host's loopback: ask from inside the host.
        probe = f"exec 3<>/dev/tcp/{LOOPBACK}/{ZK_LOOPBACK_PORT} && printf srvr >&3 && cat <&3"
        try:
            reply = self.bed_host.run(["bash", "-c", probe], timeout=5).stdout
        except subprocess.TimeoutExpired:
            return False
        return "Zookeeper version" in reply and "Mode:" in reply


@dataclass(frozen=True)
class Principal:
    """A SCRAM user of the stack (``User:<name>``) with its client certificate."""

    name: str
    password: str = field(repr=False)
    cert: CertFiles

    @property
    def credentials(self) -> SaslCredentials:
        return SaslCredentials(MECHANISM, self.name, self.password)


@dataclass
class Security:
    """Every security setting of the secured stack. Build with :meth:`create`; hand to
    ``running_stack(..., security=...)``."""

    directory: Path
    ca: Path
    broker: Principal  # sasl.inter.broker.*; also the tests' admin (super user to be)
    writer: Principal  # the Spark job's stream and df.write
    reader: Principal  # spark.read and the verifying broker client
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] = field(repr=False)
    zk_password: str = field(repr=False)  # the brokers' ZooKeeper identity's (ZK_USER)
    # Broker keys on top of the TLS, SASL and ZooKeeper TLS ones: the authorizer and
    # ZooKeeper node ACLs (create() sets them).
    broker_extra: dict[str, str] = field(default_factory=dict)
    host_certs: dict[str, CertFiles] = field(default_factory=dict, repr=False)
    zk: SecuredZooKeeper | None = None  # set by zookeeper()

    @classmethod
    def create(cls, directory: Path) -> Security:
        """A new CA, the users' certificates and random passwords, under ``directory``."""
        directory.mkdir(parents=True, exist_ok=True)
        ca_cert, ca_key = _issue("idemlog secured-stack CA", None, ca=True)
        ca = directory / "ca.crt"
        ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
        issuer = (ca_cert.subject, ca_key)

        def user(name: str) -> Principal:
            cert = _write(directory, f"user-{name}", *_issue(name, issuer, client=True))
            return Principal(name, f"{name}-{secrets.token_urlsafe(12)}", cert)

        broker = user("broker")
        zk_password = f"zk-{secrets.token_urlsafe(12)}"
        extra = {
            "authorizer.enable": "true",
            "super.users": f"User:{broker.name}",  # the brokers' own calls (ClusterAction)
            "zookeeper.set.acl": "true",
            "zookeeper.auth.digest.username": ZK_USER,
            "zookeeper.auth.digest.password": zk_password,
        }
        return cls(
            directory, ca, broker, user("writer"), user("reader"), issuer, zk_password, extra
        )

    @property
    def users(self) -> tuple[Principal, ...]:
        return (self.broker, self.writer, self.reader)

    # -- the servers -----------------------------------------------------------------------
    def host_cert(self, host: Host) -> CertFiles:
        """``host``'s certificate: ``CN=<host name>``, its address as the only SAN, for
        server and client authentication (a broker shows it to other brokers)."""
        if host.name not in self.host_certs:
            issued = _issue(host.name, self.issuer, hosts=(host.address,))
            self.host_certs[host.name] = _write(self.directory, f"host-{host.name}", *issued)
        return self.host_certs[host.name]

    def zookeeper(self, host: Host, workdir: Path) -> SecuredZooKeeper:
        """The ZooKeeper server for ``BrokerCluster(zookeeper=...)``."""
        self.zk = SecuredZooKeeper(workdir, host, self.host_cert(host), self.ca)
        return self.zk

    def broker_config(self, host: Host) -> dict[str, object]:
        """A broker's keys on ``host``, for ``BrokerCluster(host_config=...)``."""
        cert = self.host_cert(host)
        return {
            "security.protocol": PROTOCOL,
            "ssl.ca.location": str(self.ca),
            "ssl.certificate.location": str(cert.cert),
            "ssl.key.location": str(cert.key),
            "ssl.client.auth": "required",
            "sasl.enabled.mechanisms": MECHANISM.sasl_name,
            "sasl.mechanism.inter.broker.protocol": MECHANISM.sasl_name,
            "sasl.inter.broker.username": self.broker.name,
            "sasl.inter.broker.password": self.broker.password,
            "zookeeper.connect": f"{self._zookeeper().network_address}{ZK_CHROOT}",
            "zookeeper.ssl.client.enable": "true",
            "zookeeper.ssl.ca.location": str(self.ca),
            "zookeeper.ssl.certificate.location": str(cert.cert),
            "zookeeper.ssl.key.location": str(cert.key),
            **self.broker_extra,
        }

    def _zookeeper(self) -> SecuredZooKeeper:
        if self.zk is None:
            raise RuntimeError("Security.zookeeper() was not called: no ZooKeeper yet")
        return self.zk

    def zookeeper_config(self) -> Path:
        """The operator's ``--config`` for ``idemlog users|acls`` on the ZooKeeper host:
        the brokers' ``zookeeper.set.acl`` and digest identity (mode 0600: a secret)."""
        path = self.directory / "zookeeper.properties"
        path.touch(mode=0o600)
        keys = {k: v for k, v in self.broker_extra.items() if k.startswith("zookeeper.")}
        path.write_text("".join(f"{k}={v}\n" for k, v in keys.items()))
        return path

    def zookeeper_admin(self, *args: str, stdin: str | None = None) -> None:
        """``idemlog <args> --zookeeper <loopback>/<chroot> --config <zookeeper_config>``
        on the ZooKeeper host, as an operator there; raises RuntimeError naming the
        command and its stderr if it fails."""
        zk = self._zookeeper()
        where = ["--zookeeper", zk.loopback_connect, "--config", str(self.zookeeper_config())]
        done = idemlog_on(zk.bed_host, [*args, *where], stdin=stdin)
        if done.returncode != 0:
            raise RuntimeError(f"idemlog {' '.join(args)}: {done.stderr}")

    def before_brokers(self, zk: SecuredZooKeeper) -> None:
        """What ZooKeeper holds before the first broker starts: the SCRAM users, added by
        an operator on the ZooKeeper host with the brokers' ZooKeeper identity (``idemlog
        users add --config``, the password on stdin), so that their nodes are the
        brokers' only from the start."""
        assert zk is self.zk
        for user in self.users:
            self.zookeeper_admin(
                *("users", "add", user.name, "--mechanism", MECHANISM.sasl_name),
                *("--password-file", "-"),
                stdin=user.password + "\n",
            )

    def grant(self, stack: Stack) -> None:
        """The documented minimal ACLs (docs/security.md, "The minimal ACLs of a job"),
        on the topics prefixed :data:`TOPIC_PREFIX`, written in ZooKeeper by the operator
        (``idemlog acls add``): the writer's Write and Create (its job creates the
        topics) on them, and Write on its sink's transactional ids (the stream's
        ``<STREAM_QUERY_ID>/``, every df.write's ``batch-``); the reader's Read on them.
        Nothing else: the brokers are super users, the admin is ``User:broker``."""
        assert stack.brokers.zk is self.zk
        writer, reader = f"User:{self.writer.name}", f"User:{self.reader.name}"
        prefixed = ("--resource-pattern-type", "prefixed")
        topics = ("--topic", TOPIC_PREFIX, *prefixed)
        self.zookeeper_admin(
            *("acls", "add", "--allow-principal", writer),
            *("--operation", "Write", "--operation", "Create", *topics),
        )
        for sink_prefix in (f"{STREAM_QUERY_ID}/", BATCH_PREFIX):
            self.zookeeper_admin(
                *("acls", "add", "--allow-principal", writer, "--operation", "Write"),
                *("--transactional-id", sink_prefix, *prefixed),
            )
        self.zookeeper_admin(
            *("acls", "add", "--allow-principal", reader, "--operation", "Read", *topics)
        )

    # -- the clients -----------------------------------------------------------------------
    def client_keys(self, user: Principal) -> dict[str, str]:
        """The security options of ``user``'s clients: the Spark sink and source's
        ``.option(...)``, the producer's keys, the CLI's ``--command-config`` file."""
        return {
            "security.protocol": PROTOCOL,
            "ssl.ca.location": str(self.ca),
            "ssl.certificate.location": str(user.cert.cert),
            "ssl.key.location": str(user.cert.key),
            "sasl.mechanism": MECHANISM.sasl_name,
            "sasl.username": user.name,
            "sasl.password": user.password,
        }

    def tls(self, user: Principal) -> TlsMaterial:
        return TlsSettings.from_values(self.client_keys(user)).load(Side.CLIENT)

    def client(self, bootstrap: str, user: Principal, *, retries: int = 5) -> BrokerClient:
        """A broker client as ``user``."""
        return BrokerClient(bootstrap, tls=self.tls(user), sasl=user.credentials, retries=retries)

    def command_config(self, user: Principal) -> Path:
        """``user``'s ``--command-config`` file (mode 0600: it holds a password)."""
        path = self.directory / f"{user.name}.properties"
        path.touch(mode=0o600)
        path.write_text("".join(f"{k}={v}\n" for k, v in self.client_keys(user).items()))
        return path

    def idemlog(
        self, bootstrap: str, *args: str, user: Principal | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``idemlog <args> --bootstrap ... --command-config ...`` as ``user`` (default:
        the admin, ``User:broker``), from the test's own namespace."""
        config = self.command_config(user or self.broker)
        return idemlog_on(None, [*args, "--bootstrap", bootstrap, "--command-config", str(config)])
