"""bench-peers' report: the table, the ratios and the chart (``bench/peers.png``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import verdict


@dataclass(frozen=True)
class Row:
    part: str  # batch, stream, ingest; read, rstream (the streaming read)
    name: str
    seconds: float  # batch, ingest: the best run; read: the median; stream, rstream: p50
    rows: int
    nbytes: int
    cpu: float
    p95: float | None = None
    ratio: float = 0.0


def with_ratios(rows: list[Row]) -> list[Row]:
    """Each row's time over idemlog's in its part (> 1: idemlog is faster)."""
    idemlog = {r.part: r.seconds for r in rows if r.name == "idemlog"}
    return [
        Row(r.part, r.name, r.seconds, r.rows, r.nbytes, r.cpu, r.p95, r.seconds / idemlog[r.part])
        for r in rows
    ]


def print_table(rows: list[Row]) -> None:
    print(
        f"\n{'part':<7} {'sink':<8} {'seconds':>9} {'p95 s':>7} {'rows/s':>12} {'MB/s':>8} "
        f"{'CPU s':>7} {'ratio':>6}"
    )
    for r in rows:
        p95 = f"{r.p95:>7.3f}" if r.p95 is not None else f"{'':>7}"
        print(
            f"{r.part:<7} {r.name:<8} {r.seconds:>9.3f} {p95} {r.rows / r.seconds:>12,.0f} "
            f"{r.nbytes / r.seconds / 1e6:>8.1f} {r.cpu:>7.1f} {r.ratio:>6.3f}"
        )
    print(
        "(batch: best run; stream: addBatch p50 per micro-batch, p95 beside it, CPU of the "
        "whole query; ingest: best run; read: median run; rstream: triggerExecution p50 "
        "per append read by a stream (its micro-batches' sum). ratio: the row's time / "
        "idemlog's in its part, > 1: idemlog is faster; MB = 10^6 bytes)"
    )


# bench-peers' last lines: each a time over another's in one part of one run (> 1: the
# denominator is faster), with its target, a floor, from issue 27 (None: no target).
RATIOS: tuple[tuple[str, str, str, str, float | None], ...] = (
    # key, part, numerator row, denominator row, target (>=, except the microbatch one)
    ("idemlog_vs_kafka_sink", "batch", "kafka", "idemlog", 1.2),
    ("idemlog_vs_delta_sink", "batch", "delta", "idemlog", None),
    ("idemlog_vs_discard_batch", "batch", "discard", "idemlog", 0.9),
    ("idemlog_stream_vs_kafka_sink", "stream", "kafka", "idemlog", None),
    ("discard_stream_vs_kafka_sink", "stream", "kafka", "discard", None),
    ("idemlog_vs_discard_stream", "stream", "discard", "idemlog", 0.95),
    ("microbatch_idemlog_vs_discard_ratio", "stream", "idemlog", "discard", None),
    ("idemlog_broker_vs_kafka_broker", "ingest", "kafka", "idemlog", 1.0),
    ("idemlog_read_vs_kafka_source", "read", "kafka", "idemlog", 1.0),
    ("idemlog_read_vs_delta", "read", "delta", "idemlog", 0.8),
    ("idemlog_read_stream_vs_kafka_source", "rstream", "kafka", "idemlog", None),
    # The read's references (benchmarks.arrow_probe): how close idemlog's reader comes to
    # the floor of any Python data source, and where that floor and a JVM columnar scan of
    # the same rows stand against Delta.
    ("idemlog_read_vs_python_floor", "read", "arrowpy", "idemlog", None),
    ("python_floor_read_vs_delta", "read", "delta", "arrowpy", None),
    ("jvm_columnar_read_vs_delta", "read", "delta", "arrowjvm", None),
)


def print_ratios(rows: list[Row]) -> None:
    """``# meets``/``# misses`` lines for the targets, then ``key=value`` for every ratio
    whose part ran (each the numerator row's time over the denominator's)."""
    times = {(r.part, r.name): r.seconds for r in rows}
    found = [
        (key, times[(part, top)] / times[(part, bottom)], target)
        for key, part, top, bottom, target in RATIOS
        if (part, top) in times and (part, bottom) in times
    ]
    for key, value, target in found:
        if target is not None:
            print(f"# {verdict(value >= target)} the target {key} >= {target:g}")
    for key, value, _ in found:
        print(f"{key}={value:.3f}")


def draw_chart(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display; before pyplot is imported
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

    peers = [r for r in rows if r.name != "idemlog"]
    colours = {
        "batch": "tab:blue",
        "stream": "tab:orange",
        "ingest": "tab:green",
        "read": "tab:purple",
        "rstream": "tab:red",
    }
    colours = {p: c for p, c in colours.items() if any(r.part == p for r in peers)}
    figure, axes = plt.subplots(figsize=(10, 5))
    labels = [f"{r.part}\n{r.name}" for r in peers]
    # Bars grow from idemlog's 1 on a log scale: up where idemlog is faster, down where it
    # is slower, 2x either way the same length.
    bars = axes.bar(
        labels,
        [r.ratio - 1 for r in peers],
        bottom=1,
        color=[colours[r.part] for r in peers],
    )
    axes.bar_label(bars, labels=[f"{r.ratio:.2f}" for r in peers], padding=2)
    axes.set_yscale("log")
    axes.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axes.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    axes.yaxis.set_minor_formatter(NullFormatter())
    axes.axhline(1.0, color="black", linewidth=1)
    axes.set_ylabel("time / idemlog's time  (> 1: idemlog faster)")
    axes.set_title(
        "idemlog vs peers. Writes: batch best run, stream p50 addBatch, ingest best run;\n"
        "reads: batch (read) median run, streaming read (rstream) p50 triggerExecution"
    )
    axes.legend(handles=[Patch(color=c, label=p) for p, c in colours.items()])
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
