"""Where the Delta export's session finds Delta's jars: a checkout's jars/, else (an
installed wheel) ``spark.jars.packages`` naming the installed delta-spark's release."""

from __future__ import annotations

import importlib.metadata

import pytest

from spark_sink.export import delta
from spark_sink.export.delta import ExportError, delta_conf, delta_jars_conf


def test_a_checkouts_jars_are_used_and_nothing_is_downloaded() -> None:
    assert any("delta-spark_" in jar for jar in delta.project_jars()), "make jars"
    assert delta_jars_conf() == {}
    assert "spark.jars.packages" not in delta_conf()


def test_without_local_jars_the_installed_delta_spark_release_is_asked_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(delta, "project_jars", lambda: [])
    version = importlib.metadata.version("delta-spark")
    # From Delta 4.4 the artifact names the Spark release too (pyspark 4.2's here).
    artifact = f"io.delta:delta-spark_4.2_2.13:{version}"
    assert delta_jars_conf() == {"spark.jars.packages": artifact}
    assert delta_conf()["spark.sql.extensions"] == delta.DELTA_EXTENSION


def test_without_delta_spark_installed_the_export_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(delta, "project_jars", lambda: [])

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    # idemlog is on no package index: the line names the wheel, not `idemlog[spark]`.
    extra = r"needs delta-spark, which comes with idemlog's \[spark\] extra: "
    with pytest.raises(ExportError, match=extra + r"pip install '<the idemlog wheel>\[spark\]'"):
        delta_jars_conf()
