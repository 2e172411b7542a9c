"""bench-peers' report: the table, the ratios and the chart (``bench/peers.png``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Row:
    part: str  # batch, stream, ingest
    name: str
    seconds: float  # batch and ingest: the best run; stream: p50 per micro-batch
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
        "whole query; ingest: best run. ratio: the row's time / idemlog's in its part, "
        "> 1: idemlog is faster; MB = 10^6 bytes)"
    )


def draw_chart(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display; before pyplot is imported
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

    peers = [r for r in rows if r.name != "idemlog"]
    colours = {"batch": "tab:blue", "stream": "tab:orange", "ingest": "tab:green"}
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
        "idemlog vs peers: batch best run, stream p50 micro-batch (addBatch), ingest best run"
    )
    axes.legend(handles=[Patch(color=c, label=p) for p, c in colours.items()])
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
