"""Write docs/protocol.md's tables of the DoAction bodies from the request classes.

    python scripts/protocol_doc.py [--check]

(``make protocol-doc``.) Each table sits between a ``<!-- BEGIN generated: NAME ... -->``
and an ``<!-- END generated: NAME -->`` line of the page, in a code block; the text around
them is written by hand. The rows come from ``broker_core.protocol.action_table`` (each
request class's ``WIRE``). ``--check`` writes nothing and exits 1 if the page is stale;
``tests/unit/test_protocol_table.py`` runs the same comparison.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "protocol.md"
BEGIN = "<!-- BEGIN generated: {name} (scripts/protocol_doc.py, from the request classes) -->"
END = "<!-- END generated: {name} -->"


def updated(text: str, tables: Mapping[str, str]) -> str:
    """``text`` with each table's block replaced; ValueError naming a table whose
    markers the page lacks."""
    for name, table in tables.items():
        begin, end = BEGIN.format(name=name), END.format(name=name)
        pattern = re.compile(re.escape(begin) + r"\n.*?" + re.escape(end), re.DOTALL)
        if not pattern.search(text):
            raise ValueError(f"the page has no block {begin!r} ... {end!r}")
        block = f"{begin}\n```\n{table}```\n{end}"
        text = pattern.sub(lambda _m, block=block: block, text, count=1)
    return text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from broker_core.protocol.action_table import tables

    text = PAGE.read_text()
    new = updated(text, tables())
    if args.check:
        if new != text:
            print(f"{PAGE.relative_to(REPO)} is stale: run python scripts/protocol_doc.py")
            return 1
        return 0
    if new != text:
        PAGE.write_text(new)
        print(f"wrote {PAGE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
