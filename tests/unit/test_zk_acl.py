"""The ZooKeeper ACL rule alone (``broker_core.security.zk_acl``): the keys' checks, the
ACL each path gets, and that every znode creation in product code goes through it. What
ZooKeeper does with the ACLs is tested on a real server: tests/broker/test_zk_acl.py."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from kazoo.security import ANYONE_ID_UNSAFE, OPEN_ACL_UNSAFE, Permissions

from broker_core.errors import InvalidConfigError
from broker_core.security import zk_acl
from broker_core.security.zk_acl import ZkAuth, acl_for, is_sensitive
from broker_core.server.config.broker_config import BrokerConfig

ROOT = Path(__file__).resolve().parents[2]
CREDS = {"zookeeper.auth.digest.username": "brokers", "zookeeper.auth.digest.password": "s3cret"}


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"zookeeper.set.acl": True}, "zookeeper.auth.digest.username"),
        ({"zookeeper.auth.digest.username": "brokers"}, "zookeeper.auth.digest.password"),
        ({"zookeeper.auth.digest.password": "x"}, "zookeeper.auth.digest.username"),
        ({**CREDS, "zookeeper.auth.digest.username": "a:b"}, "zookeeper.auth.digest.username"),
    ],
)
def test_incomplete_or_bad_identity_is_refused_at_load_naming_the_key(
    values: dict[str, object], named: str
) -> None:
    with pytest.raises(InvalidConfigError, match=re.escape(named)):
        ZkAuth.from_values(values)
    with pytest.raises(InvalidConfigError, match=re.escape(named)):
        BrokerConfig.from_mapping({"zookeeper.connect": "127.0.0.1:2181", **values})


def test_kazoo_arguments_authenticate_with_the_identity_and_set_acls_only_when_asked() -> None:
    assert ZkAuth.from_values({}).kazoo_arguments() == {}
    auth = ZkAuth.from_values(CREDS)
    assert auth.kazoo_arguments() == {"auth_data": [("digest", "brokers:s3cret")]}
    secured = ZkAuth.from_values({**CREDS, "zookeeper.set.acl": "true"}).kazoo_arguments()
    assert secured["auth_data"] == [("digest", "brokers:s3cret")]
    owner, world = secured["default_acl"]
    assert owner.perms == Permissions.ALL and owner.id.scheme == "digest"
    assert owner.id.id.startswith("brokers:") and "s3cret" not in owner.id.id
    assert world.perms == Permissions.READ and world.id == ANYONE_ID_UNSAFE


def test_each_path_gets_the_rule_of_its_client() -> None:
    open_client = SimpleNamespace(default_acl=None)
    assert acl_for(open_client, "/idemlog/topics/t") == OPEN_ACL_UNSAFE
    assert acl_for(open_client, "/idemlog/config/users/alice") == OPEN_ACL_UNSAFE
    secure = ZkAuth.from_values({**CREDS, "zookeeper.set.acl": True}).secure_acl()
    client = SimpleNamespace(default_acl=secure)
    assert acl_for(client, "/prod/idemlog/brokers/ids/1") == secure
    assert acl_for(client, "/prod/idemlog/config") == secure  # Kafka's /config is readable
    for users in ("/idemlog/config/users", "/prod/idemlog/config/users/alice"):
        assert acl_for(client, users) == [secure[0]], users  # the brokers only
    assert is_sensitive("/config/users") and not is_sensitive("/config/usersx")
    assert not is_sensitive("/idemlog/topics/config") and not is_sensitive("/users/config")


def test_may_change_compares_identities_not_names() -> None:
    secure = ZkAuth.from_values({**CREDS, "zookeeper.set.acl": True}).secure_acl()
    assert ZkAuth.from_values(CREDS).may_change(secure)
    wrong = {**CREDS, "zookeeper.auth.digest.password": "guess"}
    assert not ZkAuth.from_values(wrong).may_change(secure)
    assert not ZkAuth().may_change(secure)
    assert ZkAuth().may_change(OPEN_ACL_UNSAFE)


# Creating a znode: kazoo's create/ensure_path (and their _async forms) and a
# transaction's create. Any of them named anywhere but through zk_acl skips the rule.
_CREATION = re.compile(r"(?<!zk_acl)\.(create|create_async|ensure_path|ensure_path_async)\b(?!_)")


def test_no_znode_is_created_but_through_the_acl_rule() -> None:
    offenders = []
    for package in ("broker_core", "spark_sink", "jobs"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == ROOT / "broker_core" / "security" / "zk_acl.py":
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if _CREATION.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "create znodes through broker_core.security.zk_acl:\n" + "\n".join(
        offenders
    )
    # The pattern does find a direct call (the check can fail).
    assert _CREATION.search("self._client.create_async(path, data)")
    assert _CREATION.search("functools.partial(client.ensure_path_async, path)")
    assert not _CREATION.search("zk_acl.create_async(self._client, path)")
    assert zk_acl.create_async and zk_acl.ensure_path_async and zk_acl.transaction_create


def _idemlog(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker_core.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_set_acl_needs_a_mode_and_secure_needs_the_identity(tmp_path: Path) -> None:
    no_mode = _idemlog("zookeeper", "set-acl", "--zookeeper", "127.0.0.1:1/x")
    assert no_mode.returncode == 2 and "--secure" in no_mode.stderr
    bare = tmp_path / "bare.properties"
    bare.write_text("zookeeper.set.acl=false\n")
    secure = _idemlog(
        "zookeeper", "set-acl", "--zookeeper", "127.0.0.1:1/x", "--config", str(bare), "--secure"
    )
    assert secure.returncode == 2, secure
    assert "Traceback" not in secure.stderr
    assert "zookeeper.auth.digest.username" in secure.stderr, secure.stderr
