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
        ("flush.writeback.bytes", -1, r"flush\.writeback\.bytes=-1 is below the minimum 0"),
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


def test_properties_file_in_the_whole_java_format(tmp_path: Path) -> None:
    path = tmp_path / "full.properties"
    path.write_text(
        "# hash comment\n"
        "! bang comment\n"
        "\n"
        "plain=value\n"
        "colon: with colon\n"
        "spaced   value after whitespace\n"
        "  indented = trimmed  \n"
        "continued = first, \\\n"
        "            second\n"
        "escaped\\=key\\:x = tab\\there\\nnewline \\u00e9\n"
        "empty=\n"
        "utf8=é\n"
    )
    assert load_properties(path) == {
        "plain": "value",
        "colon": "with colon",
        "spaced": "value after whitespace",
        "indented": "trimmed",
        "continued": "first, second",
        "escaped=key:x": "tab\there\nnewline é",
        "empty": "",
        "utf8": "é",
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a=1\n\nsegment.bytes\n", r"bad\.properties:3: expected key=value, got 'segment\.bytes'"),
        ("a=1\nsegment.bytes   \n", r"bad\.properties:2: expected key=value"),
        ("a=1\n=orphan\n", r"bad\.properties:2: empty key"),
        ("a=1\nb = x \\\n  y\na: 2\n", r"bad\.properties:4: a set twice"),
        ("a=1\nb=\\u00zz\n", r"bad\.properties:2: invalid escape '\\\\u00zz'"),
    ],
)
def test_properties_file_rejects_what_no_config_can_mean(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "bad.properties"
    path.write_text(text)
    with pytest.raises(InvalidConfigError, match=message):
        load_properties(path)
