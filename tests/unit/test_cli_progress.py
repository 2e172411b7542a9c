"""``broker_core.cli.progress``: lines every interval off a terminal, a bar on one."""

from __future__ import annotations

import io

from broker_core.cli.progress import Progress


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_off_a_terminal_one_line_per_interval_and_the_final_state_once() -> None:
    clock, out = _Clock(), io.StringIO()
    with Progress("consume t", total=10, stream=out, tty=False, interval_s=5, clock=clock) as p:
        for _ in range(4):
            p.advance()
        assert out.getvalue() == ""  # no interval has passed: nothing yet
        clock.now += 5
        p.advance()
        clock.now += 1
        p.advance(5)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("consume t: 5/10 (50%) 1/s")
    assert lines[1].startswith("consume t: 10/10 (100%)")
    assert "\r" not in out.getvalue()


def test_on_a_terminal_a_bar_redrawn_in_place_ending_its_line() -> None:
    clock, out = _Clock(), io.StringIO()
    p = Progress("export", total=4, stream=out, tty=True, interval_s=0.1, clock=clock)
    clock.now += 1
    p.advance(2)
    p.close()
    p.close()  # idempotent
    text = out.getvalue()
    assert text.count("\r\x1b[K") == 2 and text.endswith("\n")
    assert "[###############...............] 2/4" in text


def test_an_unknown_total_counts_and_a_broken_stream_is_ignored() -> None:
    out = io.StringIO()
    p = Progress("rows", unit="rows", stream=out, tty=False, clock=_Clock())
    p.advance(3)
    assert p.render().startswith("rows: 3 rows ")
    out.close()
    p.close()  # a closed stderr: progress is advice, nothing raises
