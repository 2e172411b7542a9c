"""The jar fetch scripts put the jars where the caller asked, from a fresh clone.

They once did not: ``make kafka-jars`` passed the relative folder ``jars``, and ``mvn -f
scripts/kafka-broker-pom.xml`` resolves a relative ``-DoutputDirectory`` against the pom's
folder, so the jars landed in ``scripts/jars/`` and the script failed. Here a stand-in
``mvn`` on ``PATH`` resolves paths as Maven does (against the pom's folder under ``-f``,
else against the working directory) and writes the jar files it was asked for; the
scripts run from a copy of ``scripts/`` in a temporary clone, called with a relative
folder from elsewhere, as the Makefile and a user call them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FAKE_MVN = r"""#!/usr/bin/env python3
# Maven's path resolution and dependency:copy(-dependencies), without the network.
import os, sys
args = sys.argv[1:]
base = os.getcwd()
props = {}
for i, a in enumerate(args):
    if a == "-f":
        base = os.path.dirname(os.path.abspath(args[i + 1]))
    if a.startswith("-D") and "=" in a:
        key, value = a[2:].split("=", 1)
        props[key] = value
out = props["outputDirectory"]
out = out if os.path.isabs(out) else os.path.join(base, out)
os.makedirs(out, exist_ok=True)
names = []
if "dependency:copy-dependencies" in args:
    version = props["kafka.version"]  # the pom's closure: the broker and Kafka's tools
    names = [f"kafka_2.13-{version}.jar", f"kafka-tools-{version}.jar", "kafka-clients-4.1.2.jar"]
elif "dependency:copy" in args:
    _, artifact, version = props["artifact"].split(":")
    names = [f"{artifact}-{version}.jar"]
for name in names:
    with open(os.path.join(out, name), "w") as f:
        f.write("jar")
with open(os.environ["FAKE_MVN_LOG"], "a") as f:
    f.write(" ".join(args) + "\n")
"""


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """A clone's layout: scripts/ copied; no jars/ yet."""
    repo = tmp_path / "clone"
    shutil.copytree(ROOT / "scripts", repo / "scripts")
    return repo


def _run(script: str, clone: Path, cwd: Path, tmp_path: Path, *args: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    mvn = bin_dir / "mvn"
    mvn.write_text(FAKE_MVN)
    mvn.chmod(0o755)
    log = tmp_path / "mvn.log"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_MVN_LOG": str(log),
        "PY": "/nonexistent",  # skip the pyspark jar check: no venv in the clone
    }
    result = subprocess.run(
        ["bash", str(clone / "scripts" / script), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert log.read_text().strip(), "the stand-in mvn was never called"
    return log


def test_kafka_jars_land_in_the_relative_folder_the_caller_names(
    clone: Path, tmp_path: Path
) -> None:
    # As the Makefile calls it: from the clone's root, with the relative folder "jars".
    log = _run("fetch_kafka_jars.sh", clone, clone, tmp_path, "jars")
    assert (clone / "jars/kafka-broker/kafka_2.13-4.1.2.jar").is_file()
    assert (clone / "jars/kafka-broker/kafka-tools-4.1.2.jar").is_file()
    assert (clone / "jars/spark-kafka/spark-sql-kafka-0-10_2.13-4.2.0.jar").is_file()
    assert [p.name for p in clone.glob("jars/.fetched-kafka-*")] == [
        ".fetched-kafka-4.1.2-tools-spark-kafka-4.2.0"  # the Makefile's KAFKA_JARS_STAMP
    ]
    assert not (clone / "scripts/jars").exists(), "jars landed beside the pom"
    assert "-f " in log.read_text(), "the broker's closure was not resolved through the pom"


def test_kafka_jars_from_another_folder_and_by_default(clone: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _run("fetch_kafka_jars.sh", clone, elsewhere, tmp_path, "out/jars")
    assert (elsewhere / "out/jars/kafka-broker/kafka_2.13-4.1.2.jar").is_file()
    _run("fetch_kafka_jars.sh", clone, elsewhere, tmp_path)  # default: <clone>/jars
    assert (clone / "jars/kafka-broker/kafka_2.13-4.1.2.jar").is_file()


def test_delta_jars_land_in_the_relative_folder_the_caller_names(
    clone: Path, tmp_path: Path
) -> None:
    _run("fetch_jars.sh", clone, clone, tmp_path, "jars")
    assert (clone / "jars/delta-spark_4.2_2.13-4.4.0.jar").is_file()
    assert (clone / "jars/.fetched-delta-4.4.0").is_file()
    assert not (clone / "scripts/jars").exists()
