"""How an ``idemlog`` command fails: one line on stderr and a documented exit code.

Every failure a command meets ends in ``main.run``'s one handler, which prints
``idemlog: <what>: <cause>; <what to do>`` (no traceback unless ``--debug`` or
``IDEMLOG_DEBUG=1`` asks for it) and exits with an ``ExitCode`` (docs/broker.md, "Exit
codes"). A usage or configuration error never shows a wire error code: it was not
answered by a broker, the operator fixes a flag or a file.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import socket
import sys
from enum import IntEnum
from typing import TYPE_CHECKING, TypeGuard

from broker_core.errors import (
    DEBUG_ENV,
    BrokerNotAvailableError,
    IdemlogError,
    InvalidConfigError,
    InvalidRequestError,
    LogDirLockedError,
    NetworkError,
    SaslAuthenticationFailedError,
    SslHandshakeError,
)

if TYPE_CHECKING:
    from broker_core.client.broker_client import NoBrokerReachableError


class ExitCode(IntEnum):
    """The CLI's exit codes (``idemlog --help`` lists them, docs/broker.md explains them)."""

    OK = 0
    FAILURE = 1  # the command ran and failed: a refused request, a data error
    USAGE = 2  # a bad flag, file, key or value (argparse's own code), credentials refused
    UNREACHABLE = 3  # no broker or ZooKeeper answered at the configured address
    INTERRUPTED = 128 + signal.SIGINT  # 130, Ctrl-C
    TERMINATED = 128 + signal.SIGTERM  # 143


EPILOG = (
    "exit codes: 0 ok; 1 the command failed (a refused request, a data error); 2 usage or "
    "configuration error (a flag, a file, a key, a value, credentials, a log.dir in use); "
    "3 unreachable (no broker at --bootstrap, no ZooKeeper at zookeeper.connect); "
    "130 interrupted (SIGINT), 143 terminated (SIGTERM). A failure is one line "
    f"'idemlog: ...' on stderr; --debug or {DEBUG_ENV}=1 adds the traceback. A reader "
    "that closes the output (idemlog ... | head) ends a command quietly, exit 0."
)

# Refused before any request reached a broker: fixed by the operator, so no wire code.
_USAGE_ERRORS: tuple[type[IdemlogError], ...] = (InvalidConfigError, InvalidRequestError)
# Answered, but what the operator configured is wrong: the credentials, the directory.
_CONFIG_ERRORS: tuple[type[IdemlogError], ...] = (
    LogDirLockedError,
    SaslAuthenticationFailedError,
    SslHandshakeError,
)
_UNREACHABLE_ERRORS: tuple[type[IdemlogError], ...] = (NetworkError, BrokerNotAvailableError)


class Unreachable(IdemlogError):
    """A server the command needs did not answer at its configured address (exit 3);
    its message names the key or flag and the address. Never sent on the wire."""

    error_code = NetworkError.error_code

    def __str__(self) -> str:
        return self.message


def classify(exc: BaseException) -> tuple[str, ExitCode]:
    """The one line (without the ``idemlog: `` prefix) and the exit code for ``exc``.

    Typed errors keep their message; usage errors lose the wire code (a subclass with a
    code of its own, such as a broker's INVALID_REPLICATION_FACTOR, keeps it); an OSError
    names its file. Anything else is a bug of idemlog's and says so (exit 1)."""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted (SIGINT)", ExitCode.INTERRUPTED
    if isinstance(exc, Unreachable):
        return exc.message, ExitCode.UNREACHABLE
    if isinstance(exc, _USAGE_ERRORS):
        if type(exc) in _USAGE_ERRORS:
            return exc.message, ExitCode.USAGE
        return str(exc), ExitCode.USAGE  # a broker's refusal of a value, with its own code
    if isinstance(exc, _CONFIG_ERRORS):
        return str(exc), ExitCode.USAGE
    if isinstance(exc, NetworkError) and _no_broker_reachable(exc):
        return (
            f"cannot reach a broker at {', '.join(exc.addresses)} "
            f"({connection_cause(exc.cause)}); check that it runs and the address is right",
            ExitCode.UNREACHABLE,
        )
    if isinstance(exc, _UNREACHABLE_ERRORS):
        return (
            f"{exc}; check that the broker runs and the address is right",
            ExitCode.UNREACHABLE,
        )
    if isinstance(exc, IdemlogError):
        return str(exc), ExitCode.FAILURE
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror or exc}", ExitCode.FAILURE
    return (
        f"unexpected {type(exc).__name__}: {exc}; this is a bug, rerun with --debug "
        "and report the traceback",
        ExitCode.FAILURE,
    )


def _no_broker_reachable(exc: NetworkError) -> TypeGuard[NoBrokerReachableError]:
    """Whether ``exc`` is the client's NoBrokerReachableError. The client is imported
    here, not with this module: every command imports this one, most need no client
    (and one that raised this has imported it already)."""
    from broker_core.client.broker_client import NoBrokerReachableError

    return isinstance(exc, NoBrokerReachableError)


# The transport's words for why a connection failed (gRPC's and the kernel's), and the
# few the operator is told; checked in this order, the first found wins.
_CONNECTION_CAUSES: tuple[tuple[str, str], ...] = (
    ("connection refused", "connection refused"),
    ("deadline exceeded", "timed out"),
    ("timed out", "timed out"),
    ("dns resolution failed", "host name not found"),
    ("name or service not known", "host name not found"),
    ("address lookup failed", "host name not found"),
    ("no route to host", "no route to host"),
    ("network is unreachable", "network unreachable"),
    ("connection reset", "connection reset"),
)


def connection_cause(text: str) -> str:
    """The cause of a failed connection in two or three words ("connection refused",
    "timed out", "host name not found" ...), read from the transport's message; "no
    answer" when it names none of them (--debug shows the whole message)."""
    lowered = text.lower()
    for needle, cause in _CONNECTION_CAUSES:
        if needle in lowered:
            return cause
    return "no answer"


def config_file_error(
    flag: str, path: str, exc: OSError | UnicodeDecodeError
) -> InvalidConfigError:
    """A configuration file that cannot be read, as a usage error naming the flag, the
    file and the cause (missing, a directory, unreadable, not UTF-8)."""
    if isinstance(exc, UnicodeDecodeError):
        line = exc.object[: exc.start].count(b"\n") + 1
        cause = (
            f"line {line}: byte 0x{exc.object[exc.start]:02x} (offset {exc.start}) is not "
            "UTF-8; save the file as UTF-8"
        )
    elif isinstance(exc, IsADirectoryError):
        cause = "is a directory; name a .properties file"
    elif isinstance(exc, FileNotFoundError):
        cause = "no such file; check the path"
    else:
        cause = f"cannot read it: {exc.strerror}"
    return InvalidConfigError(f"{flag} {path}: {cause}")


def port_in_use(host: str, port: int) -> bool:
    """Whether another socket listens on ``host:port`` now: checked before a broker
    starts and to explain a listener that failed to start (gRPC says "Server did not
    start properly" and nothing more). SO_REUSEADDR, as gRPC binds: connections of a
    previous broker still in TIME_WAIT do not count as the port being taken."""
    if port == 0:
        return False
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def stdout_reader_left() -> bool:
    """Whether stdout is a pipe whose reader has closed it (``idemlog ... | head``): the
    kernel flags the write end of such a pipe with POLLERR. A BrokenPipeError from
    anything else (a socket) is not this and stays a failure."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


def silence_stdout() -> None:
    """Point stdout's descriptor at /dev/null once its reader has left: what is still
    buffered (the interpreter flushes it at exit) then goes nowhere instead of raising a
    second BrokenPipeError there."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)
