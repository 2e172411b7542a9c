#!/usr/bin/env bash
# Fetch, from Maven Central with mvn, the jars `make bench-peers` needs:
#
#   jars/kafka-broker/  a Kafka broker (org.apache.kafka:kafka_2.13 and its runtime closure,
#                       scripts/kafka-broker-pom.xml), run as its own JVM by
#                       benchmarks/kafka_node.py: KRaft, one combined broker+controller node;
#                       and Kafka's command-line tools (org.apache.kafka:kafka-tools:
#                       TopicCommand, ConsoleConsumer...), which tests/broker/
#                       test_kafka_admin.py runs against idemlog's Kafka listener;
#   jars/spark-kafka/   Spark's Kafka sink, format("kafka"), passed with spark.jars by
#                       benchmarks/bench_peers.py only.
#
# Sub-folders, because spark_sink.session.project_jars() passes every jars/*.jar to every
# Spark session: these stay off all the others.
#
# spark-sql-kafka-0-10_2.13's runtime closure is spark-token-provider-kafka-0-10, kafka-clients,
# commons-pool2, plus jars pyspark already ships in pyspark/jars and which are therefore NOT
# fetched, so Spark's versions stay the only ones on the classpath: scala-parallel-collections,
# spark-tags, jsr305, and kafka-clients' lz4-java, snappy-java, zstd-jni, slf4j-api. (pyspark
# ships commons-pool 1.x, a different artifact, and no kafka-clients.) kafka-clients and
# commons-pool2 are the versions spark-sql-kafka's pom names.
#
# Idempotent: a stamp file per version pair makes a second run return at once; a run for
# other versions replaces both folders.
#
#   scripts/fetch_kafka_jars.sh [JARS_DIR]
#       KAFKA_VERSION (4.1.2), SPARK_VERSION (4.2.0: the installed pyspark's),
#       KAFKA_CLIENTS_VERSION (3.9.2), COMMONS_POOL2_VERSION (2.13.1) override; PY
#       (.venv/bin/python) is used, when present, to check that no fetched jar duplicates one
#       in pyspark/jars.
set -euo pipefail

KAFKA_VERSION="${KAFKA_VERSION:-4.1.2}"
SPARK_VERSION="${SPARK_VERSION:-4.2.0}"
KAFKA_CLIENTS_VERSION="${KAFKA_CLIENTS_VERSION:-3.9.2}" # what spark-sql-kafka $SPARK_VERSION names
COMMONS_POOL2_VERSION="${COMMONS_POOL2_VERSION:-2.13.1}"
SCALA_BINARY=2.13
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
# Absolute: `mvn -f <pom>` resolves a relative -DoutputDirectory against the pom's folder
# (scripts/), not the caller's.
JARS_DIR="$(realpath -m -- "${1:-$REPO/jars}")"
PY="${PY:-$REPO/.venv/bin/python}"
BROKER_DIR="$JARS_DIR/kafka-broker"
SPARK_DIR="$JARS_DIR/spark-kafka"
# "tools": the broker's folder holds kafka-tools too (an older stamp's folder does not).
STAMP="$JARS_DIR/.fetched-kafka-$KAFKA_VERSION-tools-spark-kafka-$SPARK_VERSION"

SPARK_ARTIFACTS=(
  "org.apache.spark:spark-sql-kafka-0-10_${SCALA_BINARY}:${SPARK_VERSION}"
  "org.apache.spark:spark-token-provider-kafka-0-10_${SCALA_BINARY}:${SPARK_VERSION}"
  "org.apache.kafka:kafka-clients:${KAFKA_CLIENTS_VERSION}"
  "org.apache.commons:commons-pool2:${COMMONS_POOL2_VERSION}"
)

say() { echo "fetch_kafka_jars: $*"; }
fail() {
  echo "fetch_kafka_jars: $*" >&2
  exit 1
}

jar_of() { # group:artifact:version -> file name
  local artifact version
  IFS=: read -r _ artifact version <<<"$1"
  echo "$artifact-$version.jar"
}

complete() {
  [[ -f "$STAMP" && -s "$BROKER_DIR/kafka_${SCALA_BINARY}-$KAFKA_VERSION.jar" ]] || return 1
  [[ -s "$BROKER_DIR/kafka-tools-$KAFKA_VERSION.jar" ]] || return 1
  for a in "${SPARK_ARTIFACTS[@]}"; do
    [[ -s "$SPARK_DIR/$(jar_of "$a")" ]] || return 1
  done
}

# Jar file names on stdin -> artifact ids: drop "-<version>[-<suffix>].jar", where a version
# is digits and a dot (so "spark-sql-kafka-0-10_2.13-4.2.0.jar" keeps its "-0-10_2.13").
artifact_names() { sed -E 's/-[0-9]+\.[^-]*(-[^-]*)?\.jar$//'; }

# mvn -q still prints colour codes: keep its output for a failure only.
mvn_quiet() {
  local out
  if ! out="$(mvn -B -q -C "$@" 2>&1)"; then
    echo "$out" >&2
    fail "mvn $* failed"
  fi
}

# Two jars of one artifact (e.g. two slf4j-api) would both be on the classpath.
no_duplicate_artifacts() {
  local dups
  dups="$(find "$1" -maxdepth 1 -name '*.jar' -printf '%f\n' | artifact_names |
    sort | uniq -d)"
  [[ -z "$dups" ]] || fail "$1 holds more than one version of: $dups"
}

if complete; then
  exit 0
fi

command -v mvn >/dev/null || fail "mvn not found (apt-get install maven)"
mkdir -p "$JARS_DIR"
rm -rf "$BROKER_DIR" "$SPARK_DIR" "$JARS_DIR"/.fetched-kafka-*

say "org.apache.kafka:kafka_${SCALA_BINARY}:$KAFKA_VERSION, kafka-tools and their runtime closure -> $BROKER_DIR"
# -f: the pom lists what to resolve; mvn runs from the repository root, which has no pom.
mvn_quiet -f "$HERE/kafka-broker-pom.xml" dependency:copy-dependencies -DincludeScope=runtime \
  -Dkafka.version="$KAFKA_VERSION" -DoutputDirectory="$BROKER_DIR"
for jar in "kafka_${SCALA_BINARY}-$KAFKA_VERSION.jar" "kafka-tools-$KAFKA_VERSION.jar"; do
  [[ -s "$BROKER_DIR/$jar" ]] || fail "$BROKER_DIR/$jar missing after mvn"
done
no_duplicate_artifacts "$BROKER_DIR"

mkdir -p "$SPARK_DIR"
for a in "${SPARK_ARTIFACTS[@]}"; do
  say "$a -> $SPARK_DIR"
  # dependency:copy takes the one jar, not its closure: the rest is pyspark's (see above).
  mvn_quiet dependency:copy -Dartifact="$a" -DoutputDirectory="$SPARK_DIR"
  [[ -s "$SPARK_DIR/$(jar_of "$a")" ]] || fail "$SPARK_DIR/$(jar_of "$a") missing after mvn"
done
if [[ -x "$PY" ]] && pyspark_jars="$("$PY" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))' 2>/dev/null)"; then
  for f in "$SPARK_DIR"/*.jar; do
    name="$(basename "$f" | artifact_names)"
    if compgen -G "$pyspark_jars/$name-[0-9]*.jar" >/dev/null; then
      fail "$name is in $pyspark_jars already: two versions would be on Spark's classpath"
    fi
  done
fi
touch "$STAMP"
say "$(find "$BROKER_DIR" -name '*.jar' | wc -l) jars, $(du -sk "$BROKER_DIR" | cut -f1) KiB in $BROKER_DIR"
for f in "$SPARK_DIR"/*.jar; do
  say "$(du -k "$f" | cut -f1) KiB $f"
done
