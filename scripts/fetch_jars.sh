#!/usr/bin/env bash
# Fetch the jars Spark needs for Delta Lake into jars/, from Maven Central with mvn.
#
# spark_sink.session.local_session() passes every jars/*.jar with spark.jars, so nothing is
# downloaded when a job or a test of a checkout runs (spark.jars.packages only from an
# installed wheel, which has no jars/: spark_sink.export.delta.delta_jars_conf).
#
# The runtime closure of io.delta:delta-spark_4.2_2.13:4.4.0 (mvn dependency:tree
# -Dscope=runtime) is delta-spark, delta-storage, unitycatalog-client (used by
# delta-storage for Unity Catalog managed tables only; its jackson and openapitools
# dependencies are excluded by delta-storage), plus scala-library, slf4j-api, log4j-api,
# log4j-core, log4j-slf4j2-impl and jsr305, which pyspark already ships in pyspark/jars
# (as it ships antlr4-runtime, which Delta's SQL parser uses): only the first three are
# fetched, so Spark's own versions of the rest stay the only ones on the classpath.
# From 4.4 delta-spark also names delta-kernel-api, delta-kernel-defaults and
# delta-kernel-unitycatalog (Delta's Kernel-based connector; with hadoop-client, parquet,
# jackson and RoaringBitmap of their own versions), and delta-storage unitycatalog-hadoop:
# not fetched, as the export's paths (writes, reads, a table past a checkpoint:
# tests/spark/test_delta_export.py) run without them.
# From Delta 4.4 the artifact names the Spark release it is built for as well as the Scala
# one (delta-spark_<spark major.minor>_<scala>, as delta-spark's own pip_utils names it):
# pyspark 4.2 is built with Scala 2.13.
#
# Idempotent: a stamp file per version makes a second run return at once; a run for another
# version removes the jars of the previous one.
#
#   scripts/fetch_jars.sh [JARS_DIR]     (DELTA_VERSION, SPARK_BINARY, UC_CLIENT_VERSION override)
set -euo pipefail

DELTA_VERSION="${DELTA_VERSION:-4.4.0}"
UC_CLIENT_VERSION="${UC_CLIENT_VERSION:-0.6.0}" # what delta-storage $DELTA_VERSION names
SPARK_BINARY="${SPARK_BINARY:-4.2}" # the Spark release Delta $DELTA_VERSION is built for
SCALA_BINARY=2.13
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# Absolute, so mvn puts the jars where the caller means whatever folder it resolves from.
JARS_DIR="$(realpath -m -- "${1:-$(dirname "$HERE")/jars}")"
STAMP="$JARS_DIR/.fetched-delta-$DELTA_VERSION"

ARTIFACTS=(
  "io.delta:delta-spark_${SPARK_BINARY}_${SCALA_BINARY}:${DELTA_VERSION}"
  "io.delta:delta-storage:${DELTA_VERSION}"
  "io.unitycatalog:unitycatalog-client:${UC_CLIENT_VERSION}"
)

jar_of() { # group:artifact:version -> file name
  local artifact version
  IFS=: read -r _ artifact version <<<"$1"
  echo "$artifact-$version.jar"
}

complete() {
  [[ -f "$STAMP" ]] || return 1
  for a in "${ARTIFACTS[@]}"; do
    [[ -s "$JARS_DIR/$(jar_of "$a")" ]] || return 1
  done
}

if complete; then
  exit 0
fi

command -v mvn >/dev/null || {
  echo "fetch_jars: mvn not found (apt-get install maven)" >&2
  exit 1
}
mkdir -p "$JARS_DIR"
# Jars of another version would end up on spark.jars too.
rm -f "$JARS_DIR"/.fetched-delta-* "$JARS_DIR"/delta-spark_*.jar "$JARS_DIR"/delta-storage-*.jar \
  "$JARS_DIR"/unitycatalog-client-*.jar
for a in "${ARTIFACTS[@]}"; do
  echo "fetch_jars: $a"
  # -C: fail on a checksum mismatch. mvn -q still prints colour codes: keep its output
  # for a failure only.
  if ! out="$(mvn -B -q -C dependency:copy -Dartifact="$a" -DoutputDirectory="$JARS_DIR" 2>&1)"; then
    echo "$out" >&2
    echo "fetch_jars: mvn failed for $a" >&2
    exit 1
  fi
  [[ -s "$JARS_DIR/$(jar_of "$a")" ]] || {
    echo "fetch_jars: $JARS_DIR/$(jar_of "$a") missing after mvn" >&2
    exit 1
  }
done
touch "$STAMP"
for a in "${ARTIFACTS[@]}"; do
  f="$JARS_DIR/$(jar_of "$a")"
  echo "fetch_jars: $(du -k "$f" | cut -f1) KiB $f"
done
