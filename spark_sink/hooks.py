"""What a write lets a caller observe or disturb, behind one object: :class:`SinkHooks`.

The writer's tasks (``spark_sink.writer``) and the driver's commit (``spark_sink.commit``)
are handed one hooks object and call it at named points of the sink protocol, around the
producer's transport and around their own steps. The default, :data:`NO_HOOKS`, does
nothing. The sink option ``hooks`` names another class, ``module:Class`` (as Kafka's
``interceptor.classes`` names its interceptors); nothing in this package implements one.
The fault tests' failure injection is ``testkit.spark_failpoints`` and the micro-batch
benchmark's timing spans ``benchmarks.trace_hooks``, both outside the shipped package
(docs/security.md, Test hooks).

A hooks class is built with no arguments, once per process and name (:func:`load_hooks`):
on the driver when the write is planned (a name that cannot be loaded fails the query
there, naming the option) and in each Python process Spark runs the write's tasks or its
commit in. An instance is pickled as its class's name, never its state, so the module
must be importable there too (``spark.sparkContext.addPyFile``, or the executors'
``PYTHONPATH``).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from broker_core.errors import InvalidConfigError

if TYPE_CHECKING:
    from broker_core.producer.transport import Transport

OPTION = "hooks"


class Point(StrEnum):
    """Where a write calls :meth:`SinkHooks.at`. A batch write (``df.write``) is batch 0."""

    BEFORE_WRITE = "before_write"  # a task, before its InitProducerId
    MID_WRITE = "mid_write"  # a task, its first rows sent (``effect``: flush them)
    AFTER_PREPARE = "after_prepare"  # a task, its transaction prepared, no message yet
    BEFORE_COMMIT = "before_commit"  # the driver, before its commit request
    INSIDE_COMMIT = "inside_commit"  # the driver (``effect``: the commit request sent)
    AFTER_COMMIT = "after_commit"  # committed, before Spark records the batch


class SinkHooks:
    """No-op hooks; a subclass overrides what it needs. Every method runs on the write
    path, in the task's or the driver's thread: what it raises fails the task or the
    commit as any error there does."""

    def at(
        self,
        point: Point,
        batch_id: int,
        partition_id: int | None = None,
        *,
        effect: Callable[[], object] | None = None,
    ) -> None:
        """The write reached ``point`` of batch ``batch_id`` (in the task of Spark
        partition ``partition_id``; None on the driver). ``effect``, at the points that
        have one, puts the write in the middle of what the point names, for a hook that
        acts there to call first (``mid_write``: the first rows flushed into the log;
        ``inside_commit``: the commit request sent, on a thread of its own, so that it is
        in flight when the hook returns)."""

    def transport(
        self, batch_id: int, partition_id: int
    ) -> Callable[[Transport], Transport] | None:
        """A wrapper for the task's producer transport (it gets a fresh Flight transport
        of its own, not the process's shared connections), or None (the default): the
        producer's own transport, untouched."""
        return None

    def span(self, name: str, **attrs: Any) -> AbstractContextManager[dict[str, Any]]:
        """A context manager around one step of the write (``task``, ``prepare``,
        ``commit``, ...); it yields ``attrs``, to which the step may add."""
        return nullcontext(attrs)

    def __reduce__(self) -> tuple[Callable[[str], SinkHooks], tuple[str]]:
        # By name: each process builds its own instance (state stays where it was made).
        return load_hooks, (class_name(type(self)),)


NO_HOOKS = SinkHooks()


def class_name(cls: type[SinkHooks]) -> str:
    """``module:Class`` of a hooks class, as the option names it ("" for the no-op)."""
    return "" if cls is SinkHooks else f"{cls.__module__}:{cls.__qualname__}"


@functools.cache
def load_hooks(name: str) -> SinkHooks:
    """The hooks the option ``hooks`` names (``module:Class``), built once per process;
    :data:`NO_HOOKS` for "". Raises InvalidConfigError naming the option and its value
    when the class cannot be imported, is not a SinkHooks or cannot be built."""
    if not name:
        return NO_HOOKS
    module_name, _, attr = name.partition(":")
    what = f"option {OPTION!r}={name!r}"
    if not module_name or not attr:
        raise InvalidConfigError(f"{what}: not module:Class")
    try:
        found: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            found = getattr(found, part)
    except ImportError as exc:
        raise InvalidConfigError(f"{what}: cannot import {module_name!r}: {exc}") from exc
    except AttributeError:
        raise InvalidConfigError(f"{what}: module {module_name!r} has no {attr!r}") from None
    if not (isinstance(found, type) and issubclass(found, SinkHooks)):
        raise InvalidConfigError(
            f"{what}: {found!r} is not a subclass of spark_sink.hooks.SinkHooks"
        )
    try:
        return found()
    except Exception as exc:
        raise InvalidConfigError(f"{what}: {name}() failed: {exc!r}") from exc
