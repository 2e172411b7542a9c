"""The README and docs/ stay true to the repository: links resolve, named files exist.

A page that links to a moved page, or names a module that a refactoring renamed, fails
here instead of misleading a reader."""

from __future__ import annotations

import ast
import builtins
import importlib
import re
from pathlib import Path

import pytest

from broker_core.errors import ErrorCode

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "benchmarks" / "README.md", *ROOT.glob("docs/*.md")])
# [text](target) outside code; external targets (scheme:) are not checked.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# A path of this repository's code in backticks, e.g. `broker_core/log/segment.py`.
CODE_PATH = re.compile(
    r"`((?:broker_core|spark_sink|jobs|tests|benchmarks|conf|scripts)/[\w./-]*)`"
)
# A dotted module name, e.g. `broker_core.txn.coordinator.visibility.consistent_cut`.
DOTTED = re.compile(r"`((?:broker_core|spark_sink|jobs)(?:\.\w+)+)")


def _prose(text: str) -> str:
    """The page without fenced code blocks (links inside them are not links)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)


def _anchors(text: str) -> set[str]:
    """GitHub's anchors for the page's headings."""
    anchors = set()
    for heading in re.findall(r"^#+ (.+)$", _prose(text), re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


def _resolves(dotted: str) -> bool:
    """Whether ``a.b.c.D.attr`` is an importable module followed by attributes of it."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:n]))
        except ModuleNotFoundError:
            continue
        for name in parts[n:]:
            if not hasattr(target, name):
                return False
            target = getattr(target, name)
        return True
    return False


def test_the_pages_exist() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in PAGES}
    expected = {
        "README.md",
        "benchmarks/README.md",
        "docs/architecture.md",
        "docs/configuration.md",
        "docs/design.md",
        "docs/failure-model.md",
        "docs/protocol.md",
        "docs/storage.md",
    }
    assert expected <= names, expected - names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_points_to_an_existing_file_and_heading(page: Path) -> None:
    broken = []
    for target in LINK.findall(_prose(page.read_text())):
        if re.match(r"^[a-z]+:", target):
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if not resolved.exists():
            broken.append(f"{target} (no file {resolved})")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved.read_text()):
            broken.append(f"{target} (no heading #{anchor} in {resolved.name})")
    assert not broken, f"{page.relative_to(ROOT)}: broken links: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_named_file_and_module_exists(page: Path) -> None:
    text = page.read_text()
    missing = []
    for name in CODE_PATH.findall(text):
        path = name.rstrip("/.")
        if "<" in path or "*" in path:
            continue
        if not (ROOT / path).exists():
            missing.append(name)
    for dotted in DOTTED.findall(text):
        if not _resolves(dotted):
            missing.append(dotted)
    assert not missing, f"{page.relative_to(ROOT)} names what does not exist: {missing}"


def test_the_error_code_table_matches_the_code() -> None:
    text = (ROOT / "docs" / "protocol.md").read_text()
    rows = re.findall(r"^\| (-?\d+) \| `([A-Z_]+)` \| (yes|no) \|", text, re.MULTILINE)
    expected = [(str(e.code), e.name, "yes" if e.retriable else "no") for e in ErrorCode]
    assert rows == expected


def _code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def test_the_readme_quick_start_is_a_whole_script() -> None:
    """The README's first code block is the quick start a user pastes: every name it uses
    is imported or assigned in it (it was run as it stands: the notes of issue 37), and
    the contributors' two commands follow it on the first screen."""
    text = (ROOT / "README.md").read_text()
    quick_start = _code_blocks(text, "python")[0]
    assert text.index(quick_start) < text.index("make demo") < text.index("## What it is")
    assert "make test" in text[: text.index("## What it is")]
    assert not _undefined_names(quick_start), "the quick start uses names it never defines"
    assert 'format("idemlog")' in quick_start


def test_the_spark_page_opens_with_a_whole_script() -> None:
    """docs/spark.md's first code block runs as pasted, like the README's quick start: it
    once wrote to a `df` and a checkpoint `ck` it never defined (issue 37)."""
    opening = _code_blocks((ROOT / "docs" / "spark.md").read_text(), "python")[0]
    assert not _undefined_names(opening)
    assert "writeStream" in opening and "checkpointLocation" in opening


def test_the_packages_docstring_example_is_a_whole_script() -> None:
    """``help(spark_sink)`` opens with the same kind of example: it once used a checkpoint
    ``ck`` and a ``df`` it never defined (issue 37)."""
    import textwrap

    import spark_sink

    doc = spark_sink.__doc__ or ""
    example = textwrap.dedent(doc.split("\n\n")[1])
    assert "writeStream" in example and "checkpointLocation" in example
    assert not _undefined_names(example), example


def _undefined_names(code: str) -> set[str]:
    """The names ``code`` reads that it neither imports nor assigns (nor are builtins)."""
    tree = ast.parse(code)
    bound = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, ast.ImportFrom | ast.Import):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return used - bound


def test_the_readme_says_no_kafka_wire_protocol_and_no_package_index() -> None:
    """The tagline agrees with the comparison table (its own Arrow Flight protocol), and
    the install lines name the wheel `make dist` builds: idemlog is on no package index."""
    text = (ROOT / "README.md").read_text()
    tagline = text.split("\n\n")[1]
    assert "Arrow Flight" in tagline and "Kafka's producer protocol" not in tagline
    install = text[text.index("## Installing") :]
    assert "pip install idemlog" not in text and "pip install 'idemlog[" not in install
    assert "make dist" in install and "dist/idemlog-<v>-py3-none-any.whl[spark]" in install
