"""``producer.<key>`` options of the Spark sink: the sink's transactions need acks=all, so
``producer.acks`` is checked on the driver, named, before anything is written (no Spark
here: ``parse_options`` is plain Python)."""

from __future__ import annotations

import re

import pytest

from broker_core.errors import InvalidConfigError
from broker_core.producer.config import ProducerConfig
from spark_sink.options import Scope, parse_options


@pytest.mark.parametrize("value", ["all", "-1", "ALL"])
def test_producer_acks_all_passes_through(value: str) -> None:
    options = parse_options({"topic": "t", "producer.acks": value}, Scope.WRITE)
    assert options.producer == {"acks": value}
    # What the writer builds from it: a transactional producer, which takes it.
    ProducerConfig.from_mapping({"transactional.id": "sink-0", **options.producer})


@pytest.mark.parametrize("value", ["1", "0", "2", "leader"])
def test_producer_acks_other_than_all_is_refused_naming_the_option(value: str) -> None:
    message = (
        f"option 'producer.acks'={value!r}: the sink writes every batch in a transaction, "
        "which requires acks=all"
    )
    with pytest.raises(InvalidConfigError, match=re.escape(message)) as info:
        parse_options({"topic": "t", "PRODUCER.ACKS": value}, Scope.WRITE)
    assert info.value.code == 40


def test_producer_acks_is_a_write_option() -> None:
    with pytest.raises(InvalidConfigError, match=r"'producer\.acks' applies to writes only"):
        parse_options({"topic": "t", "producer.acks": "all"}, Scope.READ)
