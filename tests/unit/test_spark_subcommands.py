"""``idemlog export delta`` and ``idemlog metrics record`` on an install without the
``[spark]`` extra: one line naming the extra, exit 2, and nothing Spark-side imported
while the parser is built (a broker host's ``idemlog`` never needs pyspark)."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Runs the CLI with the [spark] extra's modules made unimportable, as on a base install.
_WITHOUT_SPARK = """
import sys
for name in ("pyspark", "delta", "deltalake"):
    sys.modules[name] = None  # `import name` raises ModuleNotFoundError
from broker_core.cli.main import main
code = main(sys.argv[1:])
loaded = sorted(m for m in sys.modules if m.startswith("spark_sink"))
print("spark_sink modules loaded:", loaded, file=sys.stderr)
sys.exit(code)
"""


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _WITHOUT_SPARK, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("command", "missing"),
    [
        (
            ["export", "delta", "--topic", "t", "--table", "/tmp/x", "--partition-by", "c"],
            "pyspark",
        ),
        (["metrics", "record", "--table", "/tmp/x", "--once"], "deltalake"),
    ],
)
def test_a_spark_subcommand_without_the_extra_fails_in_one_line(
    command: list[str], missing: str
) -> None:
    done = _run(*command)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == (
        f"idemlog: {' '.join(command[:2])} needs idemlog's [spark] extra: "
        f"pip install '<the idemlog wheel>[spark]' (no module named {missing!r})"
    ), done.stderr
    assert len(lines) == 2 and "Traceback" not in done.stderr  # the line, then our probe


def test_the_parser_and_other_commands_import_nothing_of_the_spark_side() -> None:
    done = _run("metrics")  # the broker-facing command, here missing its --bootstrap|--path
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "idemlog: metrics: --bootstrap or --path is required",
        "spark_sink modules loaded: []",
    ]
    helped = _run("export", "delta", "--help")
    assert helped.returncode == 0 and "--partition-by" in helped.stdout
