"""Progress of long CLI work on stderr: a bar on a terminal, periodic lines otherwise.

``Progress`` is what ``idemlog consume --max-messages``, a Delta export or anything else
counting toward a known (or unknown) total reports through. It never writes to stdout
(that is the command's data) and never raises on a closed or broken stderr: progress is
advice, the work goes on without it.

    with Progress("consume payments", total=1000) as progress:
        for row in rows:
            ...
            progress.advance()

On a terminal (``stream.isatty()``) the bar is redrawn in place at most every
``TTY_REDRAW_S``; otherwise one line ``<label>: <done>/<total> (<pct>%) <rate>/s`` is
written at most every ``LINE_INTERVAL_S`` (log files and CI output stay short). ``close``
writes the final state once. State: two counters and a timestamp (bounded).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

# A line per this many seconds when stderr is not a terminal: a log file of a long export
# gets a few hundred lines per hour, not one per row.
LINE_INTERVAL_S = 5.0
# A terminal bar redrawn at most 10 times a second: smooth enough, and cheap.
TTY_REDRAW_S = 0.1
_BAR_WIDTH = 30
UNKNOWN_TOTAL = None  # a total not known in advance: counts and rate only, no bar


class Progress:
    """Counts work done toward ``total`` and shows it on ``stream`` (default stderr).

    ``clock`` is injectable so tests can drive time; ``tty`` overrides the terminal check.
    Thread-compatible, not thread-safe: one caller advances it."""

    def __init__(
        self,
        label: str,
        total: int | None = UNKNOWN_TOTAL,
        *,
        unit: str = "",
        stream: TextIO | None = None,
        tty: bool | None = None,
        interval_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.total = total
        self.unit = f" {unit}" if unit else ""
        self.done = 0
        self._stream = stream if stream is not None else sys.stderr
        self._tty = _isatty(self._stream) if tty is None else tty
        if interval_s is None:
            interval_s = TTY_REDRAW_S if self._tty else LINE_INTERVAL_S
        self._interval_s = interval_s
        self._clock = clock
        self._started = clock()
        self._last_shown = self._started
        self._closed = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def advance(self, n: int = 1) -> None:
        """Count ``n`` more units done; shows the state if its interval has passed."""
        self.done += n
        now = self._clock()
        if now - self._last_shown >= self._interval_s:
            self._last_shown = now
            self._show(now)

    def set_total(self, total: int | None) -> None:
        """The total, once known (e.g. after the first listing)."""
        self.total = total

    def close(self) -> None:
        """Show the final state once (a terminal's bar ends its line). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._show(self._clock(), final=True)

    def render(self, now: float | None = None) -> str:
        """The current state as one line without its ending (also what the bar shows)."""
        now = self._clock() if now is None else now
        elapsed = max(now - self._started, 1e-9)
        rate = self.done / elapsed
        count = f"{self.done}{self.unit}" if self.total is None else f"{self.done}/{self.total}"
        text = f"{self.label}: {count}"
        if self.total:
            fraction = min(self.done / self.total, 1.0)
            text += f" ({fraction * 100:.0f}%)"
            if self._tty:
                filled = int(fraction * _BAR_WIDTH)
                text = f"{self.label} [{'#' * filled}{'.' * (_BAR_WIDTH - filled)}] {count}"
        return f"{text} {rate:.0f}{self.unit}/s {elapsed:.1f}s"

    def _show(self, now: float, final: bool = False) -> None:
        line = self.render(now)
        try:
            if self._tty:
                self._stream.write(f"\r\x1b[K{line}{chr(10) if final else ''}")
            else:
                self._stream.write(f"{line}\n")
            self._stream.flush()
        except (OSError, ValueError):
            # A closed or broken stderr (a pipe whose reader left): progress is advice.
            pass


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (OSError, ValueError):
        return False
