"""Where a read starts and ends: the options ``startingOffsets`` and ``endingOffsets``.

Spark's Kafka source's forms and rules, so a Kafka user's range carries over: ``earliest``
(the log start), ``latest`` (the readable end: the stable cut with read_committed, the
high watermark with read_uncommitted) or per-partition JSON naming the topic,
``{"payments":{"0":23,"1":-2}}``, where -2 means earliest and -1 latest, and every
partition of the topic is given. A batch read may not start at latest nor end at earliest
(it would read nothing by construction, which Kafka's source refuses as a mistake);
``endingOffsets`` applies to batch reads only. A bad value fails the plan with the
option, the value and what is wrong, before any task runs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from broker_core.errors import InvalidConfigError

EARLIEST_OFFSET = -2  # Kafka's sentinels in the JSON form
LATEST_OFFSET = -1
STARTING_OPTION = "startingOffsets"
ENDING_OPTION = "endingOffsets"


class OffsetKind(StrEnum):
    EARLIEST = "earliest"
    LATEST = "latest"
    SPECIFIC = "specific"  # per-partition JSON


@dataclass(frozen=True)
class OffsetSpec:
    """One of the two options, parsed: its kind and, for the JSON form, the offset per
    partition (-2 earliest, -1 latest, else the offset itself). Picklable."""

    option: str
    kind: OffsetKind
    offsets: Mapping[int, int] = field(default_factory=dict)
    text: str = ""  # as the user gave it, for messages

    def resolve(
        self, topic: str, log_starts: Mapping[int, int], ends: Mapping[int, int]
    ) -> dict[int, int]:
        """The offset per partition this spec names, given each partition's log start and
        readable end (both keyed by every partition of ``topic``). Raises
        InvalidConfigError when the JSON form misses or invents a partition."""
        if self.kind is OffsetKind.EARLIEST:
            return dict(log_starts)
        if self.kind is OffsetKind.LATEST:
            return dict(ends)
        missing = sorted(set(log_starts) - set(self.offsets))
        unknown = sorted(set(self.offsets) - set(log_starts))
        if missing or unknown:
            why = (
                f"partitions {missing} of topic {topic!r} are missing (give every partition, "
                "-2 for earliest, -1 for latest)"
                if missing
                else f"topic {topic!r} has no partitions {unknown} (it has {len(log_starts)})"
            )
            raise InvalidConfigError(f"option {self.option!r}={self.text!r}: {why}")
        return {
            p: log_starts[p] if o == EARLIEST_OFFSET else ends[p] if o == LATEST_OFFSET else o
            for p, o in self.offsets.items()
        }


def parse_offset_spec(option: str, text: str, topic: str) -> OffsetSpec:
    """``text`` of ``option`` as an :class:`OffsetSpec`; raises InvalidConfigError naming
    the option and the value."""
    word = text.strip().lower()
    if word in (OffsetKind.EARLIEST, OffsetKind.LATEST):
        return OffsetSpec(option, OffsetKind(word), text=text)

    def bad(why: str) -> InvalidConfigError:
        return InvalidConfigError(
            f"option {option!r}={text!r} is not earliest, latest or per-partition JSON such "
            f'as {{"{topic}":{{"0":23,"1":-2}}}} (-2 earliest, -1 latest): {why}'
        )

    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise bad(f"not JSON ({exc})") from None
    if not isinstance(doc, dict) or not doc:
        raise bad("not a JSON object of a topic")
    others = sorted(set(doc) - {topic})
    if others:
        raise bad(f"it names {others}, but this read is of topic {topic!r}")
    per_partition = doc[topic]
    if not isinstance(per_partition, dict) or not per_partition:
        raise bad(f"topic {topic!r} maps to no partition offsets")
    offsets: dict[int, int] = {}
    for key, value in per_partition.items():
        if not (isinstance(key, str) and key.isdigit()):
            raise bad(f"partition {key!r} is not a partition number")
        if isinstance(value, bool) or not isinstance(value, int) or value < EARLIEST_OFFSET:
            raise bad(f"partition {key}: {value!r} is not an offset, -2 or -1")
        offsets[int(key)] = value
    return OffsetSpec(option, OffsetKind.SPECIFIC, offsets, text)


def check_batch_range(starting: OffsetSpec, ending: OffsetSpec) -> None:
    """Refuse what Spark's Kafka source refuses for a batch read: a start at latest, an
    end at earliest (each reads nothing by construction: a mistake, not a range)."""
    if starting.kind is OffsetKind.LATEST or LATEST_OFFSET in starting.offsets.values():
        raise InvalidConfigError(
            f"option {STARTING_OPTION!r}={starting.text!r}: a batch read cannot start at "
            "latest (it would read nothing); use earliest, an offset, or a streaming query"
        )
    if ending.kind is OffsetKind.EARLIEST or EARLIEST_OFFSET in ending.offsets.values():
        raise InvalidConfigError(
            f"option {ENDING_OPTION!r}={ending.text!r}: a batch read cannot end at earliest "
            "(it would read nothing); use latest or an offset"
        )


def check_range(
    topic: str,
    starts: Mapping[int, int],
    ends: Mapping[int, int],
    log_starts: Mapping[int, int],
    readable: Mapping[int, int],
) -> None:
    """Refuse a planned batch range that cannot be read as asked: a start below the log
    start (retention deleted those rows), an end past the readable end (rows not there or
    not committed yet), a start past its end. Each names the option, the partition and
    the offsets."""
    for p in sorted(starts):
        start, end = starts[p], ends[p]
        if start < log_starts[p]:
            raise InvalidConfigError(
                f"option {STARTING_OPTION!r}: topic {topic!r} partition {p} starts at "
                f"{log_starts[p]} (offsets below were deleted), not at {start}"
            )
        if end > readable[p]:
            raise InvalidConfigError(
                f"option {ENDING_OPTION!r}: topic {topic!r} partition {p} is readable up to "
                f"{readable[p]}, not up to {end}"
            )
        if start > end:
            raise InvalidConfigError(
                f"options {STARTING_OPTION!r}/{ENDING_OPTION!r}: topic {topic!r} partition "
                f"{p} would start at {start}, past its end {end}"
            )
