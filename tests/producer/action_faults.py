"""Faults on the fault proxy's DoAction calls (metadata, InitProducerId, AddPartitionsToTxn,
EndTxn, PrepareSinkTxn): ``tests/harness/fault_proxy.py`` injects faults into produce
streams only and forwards actions unchanged.

An :class:`ActionFault` fires on the next ``times`` calls of one action type:

* ``reset``: the call fails with a Flight UNAVAILABLE error, as the proxy's produce RESET
  does (the client sees a NETWORK_EXCEPTION). ``forwarded=True`` resets only after the
  broker handled the request: its answer is lost, and the client's retry repeats a request
  the broker already applied;
* ``error``: the call is answered with that typed broker error instead (e.g. a
  coordinator that is loading), without reaching the broker;
* ``held``: the call is held (a stalled link that never drops it) until the test sets
  ``release``, then forwarded and answered; ``released`` is set once the broker has
  answered it, ``outcome`` saying how.

Each fired fault is counted in ``FaultProxy.stats`` as ``"<kind>:<action>"``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow.flight as flight

from broker_core.errors import IdemlogError
from broker_core.protocol.wire import Action, error_message
from tests.harness.fault_proxy import FaultProxy

MAX_HOLD_S = 120.0  # a held call a test forgot to release goes on by itself


@dataclass
class ActionFault:
    action: Action
    times: int | None = 1  # None: every call
    error: IdemlogError | None = None  # None: a connection reset
    forwarded: bool = False  # reset after the broker answered (the answer is lost)
    held: bool = False  # held until ``release`` is set, then forwarded and answered
    fired: int = 0
    release: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)
    # A held call, once released: what the broker answered it (its refusal's text, or
    # "answered"), so a test sees what the late request did.
    outcome: str = ""

    @property
    def stat(self) -> str:
        if self.held:
            return f"hold:{self.action.value}"
        kind = "reset" if self.error is None else self.error.error_code.name.lower()
        return f"{kind}:{self.action.value}"


class ActionFaultProxy(FaultProxy):
    def __init__(self, upstream: str, **kwargs: Any) -> None:
        self.action_faults: list[ActionFault] = []
        self._faults_lock = threading.Lock()
        super().__init__(upstream, **kwargs)  # serves from here on

    def add_action_faults(self, *faults: ActionFault) -> None:
        with self._faults_lock:
            self.action_faults.extend(faults)

    def _next_fault(self, action_type: str) -> ActionFault | None:
        with self._faults_lock:
            for fault in self.action_faults:
                if fault.action.value == action_type and (
                    fault.times is None or fault.fired < fault.times
                ):
                    fault.fired += 1
                    self.stats[fault.stat] += 1
                    return fault
        return None

    def do_action(
        self, context: flight.ServerCallContext, action: flight.Action
    ) -> Iterator[bytes]:
        fault = self._next_fault(action.type)
        if fault is None:
            return super().do_action(context, action)
        if fault.error is not None:
            raise flight.FlightServerError(error_message(fault.error))
        if fault.held:
            fault.release.wait(MAX_HOLD_S)
            try:
                answer = list(super().do_action(context, action))
                fault.outcome = "answered"
                return iter(answer)
            except flight.FlightError as exc:
                fault.outcome = str(exc)
                raise
            finally:
                fault.released.set()
        if fault.forwarded:
            list(super().do_action(context, action))  # applied by the broker, answer lost
        raise flight.FlightUnavailableError(
            f"fault proxy: connection reset during {action.type} (injected)"
        )
