"""docs/protocol.md's tables of the DoAction bodies are generated from the request classes
(``protocol.action_table``, ``scripts/protocol_doc.py``): the page holds what they render,
each class's documented body names the fields its ``from_doc`` reads, and each documented
answer the fields its response class's ``from_doc`` reads."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import re
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import get_type_hints

import pytest

from broker_core.protocol.action_table import BETWEEN_BROKERS, request_classes, tables
from broker_core.protocol.wire import Action

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "protocol.md"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("protocol_doc", ROOT / "scripts/protocol_doc.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["protocol_doc"] = module
    spec.loader.exec_module(module)
    return module


def test_the_page_holds_the_generated_tables() -> None:
    text = PAGE.read_text()
    assert _script().updated(text, tables()) == text, (
        "docs/protocol.md is stale: run python scripts/protocol_doc.py"
    )


def test_a_changed_class_makes_the_page_stale() -> None:
    text = PAGE.read_text()
    changed = dict(tables(), actions="ping  {} -> {broker_id}\n")
    assert _script().updated(text, changed) != text
    with pytest.raises(ValueError, match="no block"):
        _script().updated("no markers here", tables())


def test_every_action_has_a_request_with_its_row() -> None:
    classes = request_classes()
    assert set(classes) == set(Action)
    rendered = "".join(tables().values())
    for action in Action:
        assert re.search(rf"^{action.value} ", rendered, re.MULTILINE), action
    assert set(BETWEEN_BROKERS) <= set(Action)


# -- the fields a from_doc reads ------------------------------------------------------------
_MODULES = [
    "broker_core.protocol.wire",
    "broker_core.protocol.requests",
    "broker_core.protocol.coordinator_keys",
    "broker_core.protocol.admin_requests",
    "broker_core.protocol.metrics",
    "broker_core.protocol.replica",
    "broker_core.protocol.stable_cut",
    "broker_core.protocol.txn_requests",
]


class _Source:
    """The protocol modules' functions and methods, with their imports and string
    constants, to follow a ``from_doc`` into the helpers it calls."""

    def __init__(self) -> None:
        self.functions: dict[tuple[str, str], ast.FunctionDef] = {}
        self.constants: dict[tuple[str, str], str] = {}
        self.imports: dict[tuple[str, str], tuple[str, str]] = {}
        for name in _MODULES:
            tree = ast.parse(inspect.getsource(importlib.import_module(name)))
            for node in tree.body:
                if isinstance(node, ast.FunctionDef):
                    self.functions[name, node.name] = node
                elif isinstance(node, ast.ClassDef):
                    for item in node.body:
                        if isinstance(item, ast.FunctionDef):
                            self.functions[name, f"{node.name}.{item.name}"] = item
                elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                    for target in node.targets:
                        if isinstance(target, ast.Name) and isinstance(node.value.value, str):
                            self.constants[name, target.id] = node.value.value
                elif isinstance(node, ast.ImportFrom) and node.module:
                    for alias in node.names:
                        self.imports[name, alias.asname or alias.name] = (node.module, alias.name)

    def resolve(self, module: str, name: str) -> tuple[str, str] | None:
        """Where ``name`` as used in ``module`` is defined (function or constant)."""
        head, _, rest = name.partition(".")
        if (module, name) in self.functions or (module, name) in self.constants:
            return module, name
        if (module, head) in self.imports:
            source, original = self.imports[module, head]
            return self.resolve(source, original + ("." + rest if rest else ""))
        return None

    def string(self, module: str, node: ast.expr) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            where = self.resolve(module, node.id)
            return None if where is None else self.constants.get(where)
        return None

    def strings(self, module: str, node: ast.expr, function: ast.FunctionDef) -> set[str]:
        """The field names ``node`` stands for: a string, a module's string constant, or
        a name a loop in ``function`` binds to each of a literal list's first items
        (``for name, kind in (("topic", str), ...)``)."""
        text = self.string(module, node)
        if text is not None:
            return {text}
        if not isinstance(node, ast.Name):
            return set()
        found: set[str] = set()
        for loop in ast.walk(function):
            if not isinstance(loop, (ast.For, ast.comprehension)):
                continue
            target = loop.target
            if isinstance(target, ast.Tuple) and target.elts:
                target = target.elts[0]
            if not (_is(target, {node.id}) and isinstance(loop.iter, (ast.Tuple, ast.List))):
                continue
            for item in loop.iter.elts:
                first = item.elts[0] if isinstance(item, ast.Tuple) and item.elts else item
                if (text := self.string(module, first)) is not None:
                    found.add(text)
        return found

    def fields_read(self, module: str, name: str, seen: set[tuple[str, str]]) -> set[str]:
        """The body fields the function reads from its ``doc`` parameter: the name
        handed to every call on ``doc``, its subscripts, ``get``s and ``in`` tests, and
        those of the functions it hands ``doc`` to."""
        if (module, name) in seen:
            return set()
        seen.add((module, name))
        function = self.functions[module, name]
        params = [a.arg for a in function.args.args if a.arg not in ("self", "cls")]
        docs = _aliases(function, params[0])
        found: set[str] = set()
        for node in ast.walk(function):
            key: ast.expr | None = None
            if isinstance(node, ast.Call) and node.args and _is(node.args[0], docs):
                key = node.args[1] if len(node.args) > 1 else None
                where = self.resolve(module, ast.unparse(node.func))
                if where is not None and where in self.functions:
                    found |= self.fields_read(*where, seen)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and _is(node.func.value, docs)
                and node.func.attr == "get"
                and node.args
            ):
                key = node.args[0]
            elif isinstance(node, ast.Subscript) and _is(node.value, docs):
                key = node.slice
            elif isinstance(node, ast.Compare) and any(_is(c, docs) for c in node.comparators):
                key = node.left
            if key is not None:
                found |= self.strings(module, key, function)
        return found


def _is(node: ast.expr, names: set[str]) -> bool:
    return isinstance(node, ast.Name) and node.id in names


def _aliases(function: ast.FunctionDef, doc: str) -> set[str]:
    """``doc`` and the names bound to it: ``items = [doc] ...``, then ``for item in
    items`` (``write_txn_markers`` reads its one producer's fields as it reads each of
    ``producers``)."""
    names = {doc}
    while True:
        before = len(names)
        for node in ast.walk(function):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                listed = any(
                    isinstance(n, (ast.List, ast.Tuple)) and any(_is(e, names) for e in n.elts)
                    for n in ast.walk(node.value)
                )
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if listed:
                    names |= {t.id for t in targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.For) and any(_is(n, names) for n in ast.walk(node.iter)):
                target = node.target
                if isinstance(target, ast.Tuple):
                    target = target.elts[-1]
                if isinstance(target, ast.Name):
                    names.add(target.id)
        if len(names) == before:
            return names


def _documented_fields(body: str) -> set[str]:
    """The top-level field names of each ``{...}`` of a documented body."""
    names: set[str] = set()
    stack: list[str] = []
    for match in re.finditer(r"[{}\[\]()]|(?<=[{,|] )\w+|(?<={)\w+", body):
        token = match.group()
        if token in "{[(":
            stack.append(token)
        elif token in "}])":
            stack.pop()
        elif stack == ["{"]:
            names.add(token)
    return names


@pytest.mark.parametrize("action", list(Action), ids=lambda a: a.value)
def test_each_documented_body_names_the_fields_from_doc_reads(action: Action) -> None:
    cls = request_classes()[action]
    read = set()  # a request the broker does not decode (ping) reads nothing
    if hasattr(cls, "from_doc"):
        read = _Source().fields_read(cls.__module__, f"{cls.__name__}.from_doc", set())
    documented = _documented_fields(cls.WIRE.body)
    assert documented == read, textwrap.dedent(
        f"""\
        {cls.__name__}.WIRE.body names {sorted(documented)}
        but {cls.__name__}.from_doc reads {sorted(read)}"""
    )


def _answer_types() -> dict[Action, type]:
    """What each action's handler answers, by its annotation (``server.requests.handlers``)."""
    from broker_core.server.requests.handlers import ActionHandlers

    return {a: get_type_hints(getattr(ActionHandlers, a.value))["return"] for a in Action}


@pytest.mark.parametrize("action", list(Action), ids=lambda a: a.value)
def test_each_documented_answer_names_the_fields_its_response_reads(action: Action) -> None:
    """An answer documented as a ``{...}`` document names what its response class's
    ``from_doc`` reads (a response that answers several actions may read more: the
    union of theirs). Binary answers and documents passed on whole are prose."""
    answers = _answer_types()
    response = answers[action]
    answer = request_classes()[action].WIRE.answer
    if not answer.startswith("{") or not hasattr(response, "from_doc"):
        return
    documented = _documented_fields(answer)
    read = _Source().fields_read(response.__module__, f"{response.__name__}.from_doc", set())
    shared = list(answers.values()).count(response) > 1
    assert documented <= read if shared else documented == read, (
        f"{action.value}: the answer names {sorted(documented)} but "
        f"{response.__name__}.from_doc reads {sorted(read)}"
    )


def test_the_field_reader_finds_what_helpers_read() -> None:
    assert _documented_fields("{a, b?: [[x, y], ..], c: {k: v}} or {d? | e}") == {
        "a", "b", "c", "d", "e"
    }  # fmt: skip
    source = _Source()
    found = source.fields_read(
        "broker_core.protocol.txn_requests", "AddPartitionsToTxnRequest.from_doc", set()
    )
    # _producer, _partitions and _topic_ids read these for it.
    assert {"producer_id", "producer_epoch", "partitions", "topic_ids"} <= found
