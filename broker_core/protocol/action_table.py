"""docs/protocol.md's tables of the ``DoAction`` bodies, rendered from the request classes.

Each typed request holds how the page shows it (``WIRE``, a ``protocol.requests.Wire``:
body, answer, note); this module finds the request of every ``wire.Action`` and renders
the two tables, the actions of clients and coordinators and those between brokers
(replication). ``scripts/protocol_doc.py`` writes them into the page, and
``tests/unit/test_protocol_table.py`` fails while the page holds anything else.
"""

from __future__ import annotations

import textwrap

from broker_core.protocol import admin_requests, metrics, replica, stable_cut, txn_requests
from broker_core.protocol.requests import Request
from broker_core.protocol.wire import Action

# The replication calls, in docs/protocol.md's "Between brokers".
BETWEEN_BROKERS = (
    Action.REPLICA_FETCH,
    Action.OFFSETS_FOR_LEADER_EPOCH,
    Action.REPLICA_LOG_START,
)
# The modules holding the typed requests (``protocol.requests`` names the families).
_REQUEST_MODULES = (admin_requests, metrics, replica, stable_cut, txn_requests)
WIDTH = 92  # of a table line, as the page's other code blocks


def request_classes() -> dict[Action, type[Request]]:
    """The typed request of each action, by ``ACTION``; ValueError if two claim one."""
    found: dict[Action, type[Request]] = {}
    for module in _REQUEST_MODULES:
        for value in vars(module).values():
            action = getattr(value, "ACTION", None)
            if not isinstance(value, type) or not isinstance(action, Action):
                continue
            if found.get(action, value) is not value:
                raise ValueError(f"{action} has two requests: {found[action]} and {value}")
            found[action] = value
    return found


def render(actions: tuple[Action, ...]) -> str:
    """A fixed-width table of ``actions``: the name, then ``body -> answer (note)``
    wrapped in the second column."""
    classes = request_classes()
    name_width = max(len(a.value) for a in actions) + 2
    lines = []
    for action in actions:
        wire = classes[action].WIRE
        text = f"{wire.body} -> {wire.answer}" + (f" ({wire.note})" if wire.note else "")
        wrapped = textwrap.wrap(
            text, WIDTH - name_width, break_long_words=False, break_on_hyphens=False
        )
        lines.append(action.value.ljust(name_width) + wrapped[0])
        lines.extend(" " * name_width + line for line in wrapped[1:])
    return "\n".join(lines) + "\n"


def tables() -> dict[str, str]:
    """The page's generated tables by name: ``actions`` (every action but the
    replication calls, in ``Action``'s order) and ``between-brokers``."""
    clients = tuple(a for a in Action if a not in BETWEEN_BROKERS)
    return {"actions": render(clients), "between-brokers": render(BETWEEN_BROKERS)}
