"""Kafka's ``ssl.principal.mapping.rules``: a certificate's subject to a principal's name.

The value is a comma-separated list of rules tried in order; the first that applies gives
the name (the principal is then ``User:<name>``):

* ``DEFAULT``: the subject's distinguished name as it is (RFC 2253, most specific
  attribute first, as Kafka prints it: ``CN=spark-job,OU=data``);
* ``RULE:pattern/replacement/`` (``/L`` lower-cases the result, ``/U`` upper-cases it):
  applies when ``pattern`` (a regular expression) matches the *whole* name; the result is
  the name with every match of ``pattern`` replaced by ``replacement``, where ``$1`` ...
  are the pattern's groups. A ``/`` inside the pattern or the replacement is written
  ``\\/``; commas inside a rule are part of it (``RULE:^CN=(.*?),OU=.*$/$1/``).

If no rule applies, the certificate is refused (Kafka: ``No rules apply to <name>, rules
[...]``). Kafka's default is ``DEFAULT``. This module mirrors Kafka's
``SslPrincipalMapper`` (its rule grammar and its way of applying a rule) with Python's
``re`` in place of ``java.util.regex``: the two agree on the patterns such rules use
(anchors, groups, classes, lazy quantifiers); Java-only constructs (possessive
quantifiers, ``\\p{...}`` classes) are refused when the rules are parsed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from broker_core.errors import InvalidConfigError

PRINCIPAL_MAPPING_RULES = "ssl.principal.mapping.rules"
DEFAULT_RULES = "DEFAULT"

# Kafka's grammar, group for group: 1 DEFAULT, 2 the pattern, 4 the replacement, 6 L/U.
_RULE = r"(DEFAULT)|RULE:((\\.|[^\\/])*)/((\\.|[^\\/])*)/([LU]?).*?|(.*?)"
_SPLITTER = re.compile(r"\s*(" + _RULE + r")\s*(,\s*|$)")
_PARSER = re.compile(_RULE)
_BACK_REFERENCE = re.compile(r"\$(\d+)")


class NoMatchingRuleError(ValueError):
    """No rule of the list applies to a distinguished name (Kafka's ``NoMatchingRule``)."""


@dataclass(frozen=True)
class MappingRule:
    """One parsed rule; ``pattern`` None is ``DEFAULT``."""

    pattern: re.Pattern[str] | None
    replacement: str = ""
    case: str = ""  # "L", "U" or "" (as given)
    text: str = DEFAULT_RULES

    def apply(self, name: str) -> str | None:
        """The mapped name, or None when the rule does not apply to ``name``."""
        if self.pattern is None:
            return name
        match = self.pattern.fullmatch(name)
        if match is None:
            return None
        template = _python_template(self.replacement, self.pattern.groups)
        result = self.pattern.sub(template, name)
        if self.case == "L":
            return result.lower()
        if self.case == "U":
            return result.upper()
        return result


def _python_template(replacement: str, groups: int) -> str:
    """Java's replacement syntax (``$1``, ``\\$`` literal) as ``re.sub``'s. A ``$n``
    beyond the pattern's groups is literal text, as Kafka escapes it."""
    out: list[str] = []
    i = 0
    while i < len(replacement):
        char = replacement[i]
        if char == "\\" and i + 1 < len(replacement):
            literal = replacement[i + 1]
            out.append("\\\\" if literal == "\\" else literal)
            i += 2
            continue
        ref = _BACK_REFERENCE.match(replacement, i)
        if ref is not None and int(ref.group(1)) <= groups:
            out.append(f"\\g<{int(ref.group(1))}>")
            i = ref.end()
            continue
        out.append("\\\\" if char == "\\" else char)
        i += 1
    return "".join(out)


@dataclass(frozen=True)
class PrincipalMapper:
    """The parsed rules of one ``ssl.principal.mapping.rules`` value (at least one)."""

    rules: tuple[MappingRule, ...]
    text: str

    @classmethod
    def parse(cls, value: str) -> PrincipalMapper:
        """Parse ``value`` (Kafka's grammar). Raises InvalidConfigError naming the key and
        the rule that is not ``DEFAULT`` nor ``RULE:pattern/replacement/[LU]``, or whose
        pattern is not a regular expression. An empty value is ``DEFAULT``."""
        rules: list[MappingRule] = []
        texts = [m.group(1).strip() for m in _SPLITTER.finditer(value or DEFAULT_RULES)]
        for text in texts:
            if not text:
                continue  # empty rules are ignored, as Kafka does
            match = _PARSER.match(text)
            if match is None or match.group(7) is not None:
                raise InvalidConfigError(
                    f"{PRINCIPAL_MAPPING_RULES}: invalid rule {text!r}: expected DEFAULT or "
                    "RULE:pattern/replacement/ (optionally /L or /U)"
                )
            if match.end() != len(text):
                raise InvalidConfigError(
                    f"{PRINCIPAL_MAPPING_RULES}: invalid rule {text!r}: unmatched substring "
                    f"{text[match.end() :]!r}"
                )
            if match.group(1) is not None:
                rules.append(MappingRule(None))
                continue
            pattern_text = match.group(2)
            try:
                pattern = re.compile(pattern_text)
            except re.error as exc:
                raise InvalidConfigError(
                    f"{PRINCIPAL_MAPPING_RULES}: rule {text!r}: the pattern {pattern_text!r} "
                    f"is not a regular expression ({exc})"
                ) from None
            rules.append(MappingRule(pattern, match.group(4), match.group(6), text))
        if not rules:
            rules = [MappingRule(None)]
        return cls(tuple(rules), value or DEFAULT_RULES)

    def name(self, distinguished_name: str) -> str:
        """The short name of ``distinguished_name`` (RFC 2253). Raises
        NoMatchingRuleError when no rule applies (Kafka's message)."""
        for rule in self.rules:
            result = rule.apply(distinguished_name)
            if result is not None:
                return result
        listed = ", ".join(rule.text for rule in self.rules)
        raise NoMatchingRuleError(f"No rules apply to {distinguished_name}, rules [{listed}]")


DEFAULT_MAPPER = PrincipalMapper.parse(DEFAULT_RULES)
