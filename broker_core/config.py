"""Configuration keys, declared once each with type, default, valid range and doc.

A ``ConfigDef`` parses a mapping of user-supplied values (strings from a file or a Spark
option, or typed Python values), rejects unknown keys by name, converts and range-checks
every value, and fills defaults. The docs rendered by ``ConfigDef.describe`` are the ones
the README tables and ``conf/`` files are generated from, so each key is documented once.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from broker_core.errors import InvalidConfigError

LONG_MAX = 2**63 - 1
INT_MAX = 2**31 - 1

ConfigValue = int | float | bool | str


@dataclass(frozen=True)
class ConfigKey:
    name: str
    type: type
    default: ConfigValue
    doc: str
    min: int | float | None = None
    max: int | float | None = None
    choices: tuple[str, ...] | None = None

    def parse(self, raw: object) -> ConfigValue:
        value = _convert(self, raw)
        if self.choices is not None and value not in self.choices:
            raise InvalidConfigError(f"{self.name}={raw!r} is not one of {', '.join(self.choices)}")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if self.min is not None and value < self.min:
                raise InvalidConfigError(f"{self.name}={raw!r} is below the minimum {self.min}")
            if self.max is not None and value > self.max:
                raise InvalidConfigError(f"{self.name}={raw!r} is above the maximum {self.max}")
        return value


def _convert(key: ConfigKey, raw: object) -> ConfigValue:
    if key.type is bool:
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in ("true", "1", "yes"):
            return True
        if text in ("false", "0", "no"):
            return False
        raise InvalidConfigError(f"{key.name}={raw!r} is not a boolean (true/false)")
    if key.type is int:
        if isinstance(raw, bool):
            raise InvalidConfigError(f"{key.name}={raw!r} is not an integer")
        if isinstance(raw, int):
            return raw
        try:
            return int(str(raw).strip().replace("_", ""))
        except ValueError:
            raise InvalidConfigError(f"{key.name}={raw!r} is not an integer") from None
    if key.type is float:
        try:
            return float(str(raw).strip())
        except ValueError:
            raise InvalidConfigError(f"{key.name}={raw!r} is not a number") from None
    if not isinstance(raw, (str, int, float)):
        raise InvalidConfigError(f"{key.name}={raw!r} is not a string")
    return str(raw)


class ConfigDef:
    """An ordered set of keys: what a component accepts, and nothing else."""

    def __init__(self, keys: Iterable[ConfigKey], *, what: str) -> None:
        self.what = what
        self._keys: dict[str, ConfigKey] = {}
        for key in keys:
            if key.name in self._keys:
                raise ValueError(f"config key {key.name} declared twice")
            self._keys[key.name] = key

    def __iter__(self) -> Iterator[ConfigKey]:
        return iter(self._keys.values())

    def __contains__(self, name: object) -> bool:
        return name in self._keys

    def key(self, name: str) -> ConfigKey:
        return self._keys[name]

    def parse(self, values: Mapping[str, object] | None = None) -> dict[str, ConfigValue]:
        """Typed values for every key: defaults overlaid with ``values``."""
        result: dict[str, ConfigValue] = {k.name: k.default for k in self._keys.values()}
        for name, raw in (values or {}).items():
            key = self._keys.get(name)
            if key is None:
                hint = difflib.get_close_matches(name, self._keys, n=1)
                suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
                raise InvalidConfigError(f"unknown {self.what} config key {name!r}{suggestion}")
            result[name] = key.parse(raw)
        return result

    def describe(self) -> list[tuple[str, str, str, str]]:
        """(name, type, default, doc) rows for documentation."""
        return [(k.name, k.type.__name__, str(k.default), k.doc) for k in self._keys.values()]


def load_properties(path: str | Path) -> dict[str, str]:
    """The keys and values of a ``.properties`` file, in the whole format Java's
    ``Properties.load`` reads (parsed by the ``javaproperties`` library): ``=``, ``:`` or
    whitespace between key and value, ``#`` and ``!`` comment lines, lines continued by a
    trailing backslash, and escapes (``\\t``, ``\\n``, ``\\uXXXX``, ``\\=``, ``\\:``, ...). The
    file is read as UTF-8. Values are trimmed, as Kafka's ConfigDef trims them.

    Raises InvalidConfigError naming the file and the line for what the format allows but
    a configuration cannot mean: a key with no separator and no value (a bare word is a
    typo, not an empty setting: write ``key=`` for that), an empty key, a key set twice;
    and for an invalid ``\\u`` escape. OSError if the file cannot be read.
    """
    text = Path(path).read_text(encoding="utf-8")
    values: dict[str, str] = {}
    line = 1  # the line the next element starts on
    import javaproperties  # here: only .properties files need it, and it imports slowly

    elements = javaproperties.parse(text)
    while True:
        try:
            element = next(elements, None)
        except javaproperties.InvalidUEscapeError as exc:
            raise InvalidConfigError(f"{path}:{line}: invalid escape {exc.escape!r}") from None
        if element is None:
            return values
        start, line = line, line + len(_NEWLINE.findall(element.source))
        if not isinstance(element, javaproperties.KeyValue):
            continue  # a comment or a blank line
        key, value = element.key, element.value.strip()
        if not key:
            raise InvalidConfigError(f"{path}:{start}: empty key in {element.source.strip()!r}")
        if not value and not _SEPARATOR.search(element.source_stripped.rstrip(" \t\f")):
            raise InvalidConfigError(
                f"{path}:{start}: expected key=value, got {element.source_stripped!r}"
            )
        if key in values:
            raise InvalidConfigError(f"{path}:{start}: {key} set twice")
        values[key] = value


# Line ends as the .properties format counts them (str.splitlines counts form feed too).
_NEWLINE = re.compile(r"\r\n|\r|\n")
# An unescaped separator after the key: "=", ":" or whitespace.
_SEPARATOR = re.compile(r"^[ \t\f]*(?:[^\\ \t\f=:]|\\.)+(?:[ \t\f]|[=:])")
