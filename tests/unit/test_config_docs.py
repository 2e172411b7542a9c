"""Each config key is declared once in code; the conf file and docs/configuration.md agree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from broker_core.config import load_properties
from broker_core.errors import InvalidConfigError
from broker_core.log.config import LOG_CONFIG, LogConfig

ROOT = Path(__file__).resolve().parents[2]


def test_conf_file_lists_every_topic_key_with_its_default() -> None:
    values = load_properties(ROOT / "conf" / "topic.properties")
    assert set(values) == {k.name for k in LOG_CONFIG}
    for key in LOG_CONFIG:
        assert key.parse(values[key.name]) == key.default, key.name
    LogConfig.from_mapping(values)


def test_docs_table_matches_the_code() -> None:
    docs = (ROOT / "docs" / "configuration.md").read_text()
    section = docs.split("## Topic configuration", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| `([a-z.]+)` \| \w+ \| `([^`]*)` \|", section, re.MULTILINE))
    assert rows == {k.name: str(k.default) for k in LOG_CONFIG}


def test_unknown_key_is_named_with_a_suggestion() -> None:
    with pytest.raises(InvalidConfigError, match=r"'segment\.byte'.*did you mean 'segment\.bytes'"):
        LogConfig.from_mapping({"segment.byte": 10})


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("segment.bytes", "ten", r"segment\.bytes='ten' is not an integer"),
        ("segment.bytes", 10, r"segment\.bytes=10 is below the minimum 1024"),
        ("flush.messages", 0, r"flush\.messages=0 is below the minimum 1"),
        ("producer.state.batch.window", True, r"producer\.state\.batch\.window=True"),
    ],
)
def test_bad_values_name_the_key_and_value(key: str, value: object, message: str) -> None:
    with pytest.raises(InvalidConfigError, match=message) as info:
        LogConfig.from_mapping({key: value})
    assert info.value.code == 40


def test_properties_file_errors_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.properties"
    path.write_text("# comment\nsegment.bytes\n")
    with pytest.raises(InvalidConfigError, match=r"bad\.properties:2: expected key=value"):
        load_properties(path)
