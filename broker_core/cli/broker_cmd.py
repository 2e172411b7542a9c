"""``idemlog`` commands that run a broker or talk to one (``broker_core.cli.main`` wires them).

idemlog broker start --config FILE [--override key=value ...]
idemlog broker list|stop (broker_core.cli.hosted_cmd)
idemlog topics create|describe|elect-leaders|delete --bootstrap host:port ...
idemlog transactions list|find-hanging|abort --bootstrap host:port ...

Every command that takes ``--bootstrap`` also takes ``--command-config FILE``: the client's
security keys (``security.protocol``, ``ssl.*``, ``sasl.*``) as Kafka's tools take them.
"""

from __future__ import annotations

import argparse
import ctypes
import faulthandler
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from broker_core.cli import registry
from broker_core.cli.failures import Unreachable, config_file_error, port_in_use
from broker_core.cli.hosted_cmd import add_hosted_commands
from broker_core.client.broker_client import BrokerClient
from broker_core.cluster.records import BrokerInfo
from broker_core.config import ConfigDef, load_properties
from broker_core.errors import DEBUG_ENV, InvalidConfigError, InvalidRequestError
from broker_core.log.dir_lock import lock_holder
from broker_core.protocol.admin_requests import TransactionListing, schema_fields
from broker_core.security.client_config import CLIENT_SASL_KEYS, sasl_credentials
from broker_core.security.local_token import discover_embedded
from broker_core.security.tls import PLAINTEXT_MATERIAL, TLS_KEYS, Side, TlsSettings
from broker_core.server.config.broker_config import IDLE_SHUTDOWN_KEY, BrokerConfig, parse_overrides

if TYPE_CHECKING:
    from broker_core.server.process.broker import Broker

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# find-hanging's default idleness: transaction.max.timeout.ms's default, beyond which no
# transaction a coordinator keeps is still open (it aborts them at their timeout).
DEFAULT_HANGING_MS = 900_000
# The ready pipe's optional second line, "metrics host:port" (read by spark_sink.embedded).
READY_METRICS = "metrics"
# -- broker start ----------------------------------------------------------------------------
_M_TRIM_THRESHOLD = -1  # glibc mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
_KEEP_FREED_BYTES = 32 * 1024 * 1024
_STOP_POLL_S = 1.0  # how late a stop signal another thread took is seen at most
# How late the end of a start is seen: the start thread cannot wake sigtimedwait.
_START_POLL_S = 0.05


def keep_large_buffers() -> bool:
    """Stop glibc from handing freed ~1 MB message buffers back to the kernel at once.

    gRPC receives every produce message into freshly allocated memory. By default glibc
    serves such blocks with mmap, or trims them off an arena's top when freed, so each
    message faults its pages in again (page faults and page clearing were ~15% of the
    broker's CPU at 1 GB/s). Keeping up to 32 MiB free per arena avoids that. glibc only;
    elsewhere nothing changes. Returns whether the settings took.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(
        mallopt(_M_MMAP_THRESHOLD, _KEEP_FREED_BYTES)
        and mallopt(_M_TRIM_THRESHOLD, _KEEP_FREED_BYTES)
    )


def _load_config(args: argparse.Namespace) -> BrokerConfig:
    """``--config`` and ``--override``; raises InvalidConfigError naming ``--config`` and
    the file when it is missing, a directory, unreadable or not UTF-8."""
    try:
        return BrokerConfig.load(args.config, args.override)
    except (OSError, UnicodeDecodeError) as exc:
        raise config_file_error("--config", args.config, exc) from exc


def _on_log_dir_path(log_dir: Path, filename: object) -> bool:
    """Whether ``filename`` is ``log.dir``, one of its parents or a file inside it."""
    if not isinstance(filename, str | os.PathLike):
        return False
    path = Path(filename).absolute()
    target = log_dir.absolute()
    return path == target or path in target.parents or target in path.parents


def _start_failure(config: BrokerConfig, exc: BaseException) -> BaseException:
    """What a failed ``Broker.start`` means for the operator: the key, the address or the
    directory at fault, and what to do. Errors already naming theirs pass unchanged."""
    from kazoo.handlers.threading import KazooTimeoutError

    if isinstance(exc, KazooTimeoutError):
        return Unreachable(
            f"zookeeper.connect={config.zookeeper_connect}: no ZooKeeper server answered "
            f"within zookeeper.session.timeout.ms={config.zookeeper_session_timeout_ms}; "
            "start ZooKeeper or correct zookeeper.connect"
        )
    if isinstance(exc, pa.ArrowException) and port_in_use(
        config.listener_host, config.listener_port
    ):
        return _port_taken(config)
    if isinstance(exc, OSError) and _on_log_dir_path(config.log_dir, exc.filename):
        return InvalidConfigError(
            f"log.dir={config.log_dir}: cannot create or open {exc.filename}: "
            f"{exc.strerror}; choose a directory this user can write"
        )
    return exc


def _port_taken(config: BrokerConfig) -> InvalidConfigError:
    return InvalidConfigError(
        f"listener.port={config.listener_port}: {config.listener_host}:"
        f"{config.listener_port} is already in use; stop the process holding it or "
        "choose another listener.port (0: any free port)"
    )


def _start_interruptibly(
    broker: Broker, stop_signals: set[signal.Signals], received: list[int]
) -> BrokerInfo | None:
    """``broker.start()`` in a thread while this (main) thread waits for a stop signal:
    the start may wait long (recovery, a ZooKeeper nobody answers, up to its session
    timeout) and must not hold Ctrl-C or SIGTERM back. Returns the started broker's info,
    or None if a stop signal came first (its number appended to ``received``); re-raises
    what the start raised. The signals stay blocked (the caller blocked them): the start
    thread inherits the mask, so only this thread's wait takes them."""
    outcome: list[BrokerInfo] = []
    failure: list[BaseException] = []
    done = threading.Event()

    def run() -> None:
        try:
            outcome.append(broker.start())
        except BaseException as exc:  # handed to the main thread, raised there
            failure.append(exc)
        finally:
            done.set()

    # Quiet kazoo's reconnect warnings while the first session is sought (one per retry,
    # every few ms against a closed port): an unreachable ZooKeeper is reported once,
    # below, naming the key. Its warnings after the start are shown again.
    kazoo_log = logging.getLogger("kazoo.client")
    level = kazoo_log.level
    kazoo_log.setLevel(logging.ERROR)
    starter = threading.Thread(target=run, name="broker-start", daemon=True)
    starter.start()
    try:
        while not done.is_set() and not received:
            taken = signal.sigtimedwait(stop_signals, _START_POLL_S)
            if taken is not None and taken.si_signo in stop_signals:
                received.append(taken.si_signo)
    finally:
        kazoo_log.setLevel(level)
    if received:
        return None
    if failure:
        raise failure[0]
    return outcome[0]


def broker_start(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT, then shut down cleanly (snapshots, clean marker).

    A stop signal during the start ends the process at once with 130 (SIGINT) or 143
    (SIGTERM) and one line: nothing was served, and what the start had written is what a
    crash leaves, recovered at the next start (docs/failure-model.md). A start that fails
    raises an error naming the key at fault (``_start_failure``)."""
    debug = args.debug or os.environ.get(DEBUG_ENV) == "1"
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.INFO, format=LOG_FORMAT, stream=sys.stderr
    )
    # A crash in native code (gRPC, Arrow) then leaves every thread's Python stack in the
    # broker's log, where it would otherwise end with the last line logged.
    faulthandler.enable(file=sys.stderr, all_threads=True)
    keep_large_buffers()
    config = _load_config(args)
    # A port another process listens on is said in one line before anything starts: left
    # to gRPC, its C++ log prints an add_port.cc error first. A process taking the port
    # after this look is still explained once the start fails (_start_failure). A live
    # broker on this log.dir (the same file started twice) is left to the start, whose
    # refusal names the directory and the pid holding it: the more telling of the two.
    if lock_holder(config.log_dir) is None and port_in_use(
        config.listener_host, config.listener_port
    ):
        raise _port_taken(config)
    # Blocked before the broker's threads exist, so they (kazoo's, gRPC's) inherit the mask
    # and the signals stay pending for the wait below. A Python handler alone once left a
    # clean stop unheard for 30 s: one delivered to another thread ran only when the main
    # thread woke on its own. A thread started at import keeps an empty mask, though, and
    # the kernel may hand it the signal: the handler notes it (the default action killed
    # the process, exit -15, no snapshots) and the wait polls for the note.
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    received: list[int] = []
    for stop in stop_signals:
        signal.signal(stop, lambda number, _frame: received.append(number))
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    # Imported here, by the one command that serves: the server's modules cost the client
    # commands of this module (topics, transactions) most of their start-up otherwise.
    from broker_core.server.process.broker import Broker

    broker = Broker(config)
    try:
        info = _start_interruptibly(broker, stop_signals, received)
    except Exception as exc:
        failure = _start_failure(config, exc)
        if failure is exc:
            raise
        raise failure from exc
    if info is None:
        name = signal.Signals(received[0]).name
        print(
            f"idemlog: broker start interrupted by {name}; nothing was served",
            file=sys.stderr,
            flush=True,
        )
        logging.shutdown()
        # The start thread may be inside recovery or a ZooKeeper wait that cannot be
        # cancelled: leave now, as a crash would (the data directory is built for that).
        os._exit(128 + received[0])
    # The line a supervisor (or the test harness) waits for: the address actually bound.
    print(f"LISTENING {info.host}:{info.port}", flush=True)
    # Where the Prometheus endpoint was bound; None without metrics.port.
    metrics = broker.metrics_endpoint.address if broker.metrics_endpoint else None
    # Listed by `idemlog broker list` until the clean stop below removes it; a crash
    # leaves it for the next listing to report as stale and remove (cli/registry.py).
    entry: Path | None = None
    try:
        entry = registry.register(
            address=f"{info.host}:{info.port}",
            log_dir=config.log_dir,
            zookeeper=bool(config.zookeeper_connect),
            config=args.config,
            metrics=metrics,
        )
    except OSError as exc:  # the listing is advice: serving does not depend on it
        logging.getLogger("idemlog.broker").warning(
            "not listed by `idemlog broker list`: cannot write %s: %s",
            registry.registry_dir(),
            exc.strerror,
        )
    if args.ready_fd is not None:
        # A launcher waiting on a pipe reads the address, then EOF; EOF alone means the
        # broker died before serving (no output parsing, no polling). A second line
        # "metrics host:port" says where the Prometheus endpoint was bound, if it runs.
        ready = f"{info.host}:{info.port}\n" + (f"{READY_METRICS} {metrics}\n" if metrics else "")
        os.write(args.ready_fd, ready.encode())
        os.close(args.ready_fd)
    idle = False
    while not received and not idle:  # one sent during the start is pending: at once
        taken = signal.sigtimedwait(stop_signals, _STOP_POLL_S)
        # Only a stop signal counts: CPython (3.11) returns an unfilled siginfo, not None,
        # when the wait is interrupted (EINTR) after its deadline -- as the SIGCONT that
        # resumes a broker stopped across the deadline does -- and its garbage number
        # once ended a resumed broker's main thread (ValueError) while its other threads
        # went on serving.
        if taken is not None and taken.si_signo in stop_signals:
            received.append(taken.si_signo)
        # idle.shutdown.ms: from a True answer on, the listener refuses every call.
        idle = not received and broker.idle_expired()
    if received:
        why = f"received {signal.Signals(received[0]).name}"
    else:
        why = (
            f"idle for {IDLE_SHUTDOWN_KEY}={config.idle_shutdown_ms} (no call, no open transaction)"
        )
    logging.getLogger("idemlog.broker").info("%s, shutting down", why)
    broker.close()
    if entry is not None:
        registry.unregister(entry)
    print("STOPPED", flush=True)
    logging.shutdown()
    sys.stderr.flush()
    # gRPC's C++ threads of calls still open after the grace period must not hold the
    # process at interpreter exit: the store is closed, so leave now.
    os._exit(0)


# -- topics ----------------------------------------------------------------------------------
def parse_schema(spec: str) -> pa.Schema:
    """``"id:int64,value:string"`` -> an Arrow schema (type names as pyarrow's aliases)."""
    fields = []
    for item in spec.split(","):
        name, sep, type_name = item.strip().partition(":")
        if not sep or not name.strip():
            raise InvalidRequestError(f"--schema entry {item!r} must be name:type")
        try:
            fields.append(pa.field(name.strip(), pa.type_for_alias(type_name.strip())))
        except ValueError as exc:
            raise InvalidRequestError(f"--schema entry {item!r}: {exc}") from exc
    return pa.schema(fields)


COMMAND_CONFIG_HELP = (
    "a .properties file of the client's security keys (security.protocol, ssl.*, sasl.*), "
    "as Kafka's tools take it (docs/security.md)"
)
BOOTSTRAP_HELP = "a broker's address, host:port[,host:port...]"
PATH_HELP = (
    "instead of --bootstrap: the embedded broker running for this directory (a Spark "
    "job's option path; the default one is ~/.idemlog/embedded)"
)
JSON_HELP = "print JSON instead of text"
COMMAND_CONFIG = ConfigDef([*TLS_KEYS, *CLIENT_SASL_KEYS], what="--command-config key")


def _command_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--command-config", metavar="FILE", help=COMMAND_CONFIG_HELP)


def _broker_arguments(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    """Where the command's broker is: ``--bootstrap`` (a cluster) or ``--path`` (the
    embedded broker of a directory, found as ``broker list`` finds brokers: its state
    file, its pid checked), one of them; and ``--command-config``."""
    where = parser.add_mutually_exclusive_group(required=required)
    where.add_argument("--bootstrap", help=BOOTSTRAP_HELP)
    where.add_argument("--path", metavar="DIR", help=PATH_HELP)
    _command_config_argument(parser)


def _client(args: argparse.Namespace) -> BrokerClient:
    """The client of ``--bootstrap`` under ``--command-config``'s keys: its TLS settings
    and, with SASL, its credentials (plaintext and unauthenticated without one). Raises
    InvalidConfigError naming an unknown key, a bad value or an unreadable file of the
    command config (never a password's value)."""
    tls = PLAINTEXT_MATERIAL
    sasl = None
    if getattr(args, "command_config", None):
        try:
            raw = load_properties(args.command_config)
        except OSError as exc:
            raise InvalidConfigError(
                f"--command-config {args.command_config!r}: cannot read it: {exc.strerror}"
            ) from None
        values = COMMAND_CONFIG.parse(raw)
        tls = TlsSettings.from_values(values).load(Side.CLIENT)
        sasl = sasl_credentials(raw)
    if getattr(args, "path", None):
        bootstrap = registry.embedded_bootstrap(os.path.expanduser(args.path))
    else:
        bootstrap = args.bootstrap
        discover_embedded(bootstrap)  # the default embedded broker's owner-only token
    return BrokerClient(bootstrap, tls=tls, sasl=sasl)


def topics_create(args: argparse.Namespace) -> int:
    schema = parse_schema(args.schema) if args.schema else None
    with _client(args) as client:
        leaders = client.create_topic(
            args.topic, args.partitions, schema=schema, config=parse_overrides(args.config)
        )
    print(f"created topic {args.topic} with {len(leaders)} partitions, leaders {leaders}")
    return 0


def _ids(broker_ids: tuple[int, ...]) -> str:
    """Broker ids as ``1,2,3`` (Kafka's topics tool shows replicas and ISR so)."""
    return ",".join(map(str, broker_ids))


def topics_describe(args: argparse.Namespace) -> int:
    """Each topic's schema, config and partitions with their offsets; ``--json`` prints
    the same ``TopicDescription`` objects (docs/broker.md, "JSON answers")."""
    with _client(args) as client:
        topics = client.describe_topics([args.topic] if args.topic else None, offsets=True)
    if args.json:
        print(json.dumps([t.to_json() for t in topics], indent=2))
        return 0
    for t in topics:
        schema = ", ".join(schema_fields(t.schema) or ["-"])
        print(f"topic {t.name}  schema [{schema}]  config {t.config or '{}'}")
        for p in t.partitions:
            line = (
                f"  partition {p.partition:>4}  leader {p.leader:>3}  "
                f"replicas {_ids(p.replicas):<8}  isr {_ids(p.isr):<8}  "
                f"leader epoch {p.leader_epoch:>3}  "
            )
            if p.offsets is None:
                print(f"{line}offline: {p.offline}")
                continue
            o = p.offsets
            print(
                f"{line}log start {o.log_start_offset:>10}  end {o.log_end_offset:>10}  "
                f"high watermark {o.high_watermark:>10}  last stable {o.last_stable_offset:>10}"
            )
    return 0


def topics_elect_leaders(args: argparse.Namespace) -> int:
    """The preferred-leader rebalance (``kafka-leader-election.sh --election-type
    preferred``): each partition whose first replica is live and in sync leads there."""
    with _client(args) as client:
        moved = client.elect_leaders([args.topic] if args.topic else None)
    if args.json:
        print(json.dumps({t: {str(p): b for p, b in m.items()} for t, m in moved.items()}))
        return 0
    count = sum(len(m) for m in moved.values())
    print(f"moved the leadership of {count} partitions to their preferred replica")
    for topic, partitions in sorted(moved.items()):
        for partition, leader in sorted(partitions.items()):
            print(f"  {topic}-{partition}: leader {leader}")
    return 0


def transactions_list(args: argparse.Namespace) -> int:
    """Open transactions, oldest first: who writes them, how old, how long idle. Like
    ``kafka-transactions.sh --find-hanging``: an old one holds its partitions' readers
    back at its first offset. ``--json`` prints the same ``TransactionListing`` rows."""
    with _client(args) as client:
        rows = client.list_transactions(args.min_age_ms, every_id=args.all)
    if args.json:
        print(json.dumps([r.to_json() for r in rows], indent=2))
        return 0
    if args.all:
        return _print_every_id(rows)
    if not rows:
        print(f"no open transaction older than {args.min_age_ms} ms")
        return 0
    print(
        f"{'transactional id':<40} {'part':>4} {'pid':>8} {'epoch':>5} {'age s':>8} "
        f"{'idle s':>8} {'timeout s':>9}  writer"
    )
    for t in rows:
        writer = (
            f"sink {t.sink_id} run {t.sink_run} batch {t.sink_batch}"
            f"{' prepared' if t.sink_prepared else ''}"
            if t.sink_id
            else "producer"
        )
        parts = ",".join(f"{topic}-{p}" for topic, p in t.partitions)
        print(
            f"{t.transactional_id:<40} {t.state_partition:>4} {t.producer_id:>8} "
            f"{t.producer_epoch:>5} {(t.age_ms or 0) / 1000:>8.1f} {t.idle_ms / 1000:>8.1f} "
            f"{(t.timeout_ms or 0) / 1000:>9.1f}  {writer}  [{parts}]"
        )
    return 0


def _print_every_id(rows: list[TransactionListing]) -> int:
    """``transactions list --all``: every id the coordinator keeps, with its state and
    last update; ids idle past transactional.id.expiration.ms disappear from it."""
    print(f"{len(rows)} transactional ids")
    if rows:
        print(
            f"{'transactional id':<40} {'state':<16} {'part':>4} {'pid':>8} {'epoch':>5} "
            f"{'idle s':>10}  sink"
        )
    for t in rows:
        print(
            f"{t.transactional_id:<40} {t.state:<16} {t.state_partition:>4} "
            f"{t.producer_id:>8} {t.producer_epoch:>5} {t.idle_ms / 1000:>10.1f}  "
            f"{t.sink_id or '-'}"
        )
    return 0


def transactions_find_hanging(args: argparse.Namespace) -> int:
    """Transactions open on a partition that no coordinator knows (KIP-664's
    ``--find-hanging``): each holds its partition's readers back at its first offset
    until ``transactions abort --topic --partition`` ends it (docs/operations.md,
    "Hanging transactions"). Exit 0 whether or not any is found."""
    if args.older_than_ms < 0:
        raise InvalidConfigError(f"--older-than-ms {args.older_than_ms}: must be >= 0")
    with _client(args) as client:
        found = client.find_hanging_transactions(args.topic, args.older_than_ms)
    if args.json:
        print(json.dumps([h.to_json() for h in found], indent=2))
        return 0
    where = f"topic {args.topic}" if args.topic else "any topic"
    if not found:
        print(f"no hanging transaction on {where} (idle at least {args.older_than_ms} ms)")
        return 0
    print(f"{len(found)} hanging transactions on {where}:")
    print(
        f"{'partition':<30} {'pid':>8} {'epoch':>5} {'coord ep':>8} {'start offset':>12} "
        f"{'idle s':>9} {'lso':>10} {'end':>10}"
    )
    for h in found:
        print(
            f"{f'{h.topic}-{h.partition}':<30} {h.producer_id:>8} {h.producer_epoch:>5} "
            f"{h.coordinator_epoch:>8} {h.txn_start_offset:>12} {h.idle_ms / 1000:>9.1f} "
            f"{h.last_stable_offset:>10} {h.log_end_offset:>10}"
        )
    print(
        "abort one with: idemlog transactions abort --bootstrap ... --topic T --partition P "
        "--producer-id ID --producer-epoch E"
    )
    return 0


def _abort_on_partition(args: argparse.Namespace) -> int:
    """``transactions abort --topic T --partition P ...``: one producer's open transaction
    on one partition, at its leader, which fences that producer there."""
    if args.partition is None:
        raise InvalidConfigError("--topic needs --partition (the partition to abort on)")
    if (args.producer_id is None) == (args.start_offset is None):
        raise InvalidConfigError(
            "--topic/--partition need --producer-id ID [--producer-epoch E] or --start-offset O "
            "(exactly one)"
        )
    if args.producer_epoch is not None and args.producer_id is None:
        raise InvalidConfigError("--producer-epoch needs --producer-id")
    for flag, value in (
        ("--partition", args.partition),
        ("--producer-id", args.producer_id),
        ("--producer-epoch", args.producer_epoch),
        ("--start-offset", args.start_offset),
    ):
        if value is not None and value < 0:
            raise InvalidConfigError(f"{flag} {value}: must be >= 0")
    with _client(args) as client:
        done = client.abort_hanging_transaction(
            args.topic,
            args.partition,
            producer_id=args.producer_id,
            producer_epoch=args.producer_epoch,
            start_offset=args.start_offset,
        )
    print(
        f"aborted the transaction of producer id {done.producer_id} on "
        f"{done.topic}-{done.partition} (from offset {done.txn_start_offset}; abort marker at "
        f"{done.marker_offset}); last stable offset now {done.last_stable_offset}; the "
        f"producer is fenced there (epoch {done.marker_epoch})"
    )
    return 0


def transactions_abort(args: argparse.Namespace) -> int:
    if args.topic is not None:
        if args.transactional_id is not None:
            raise InvalidConfigError("give --transactional-id or --topic/--partition, not both")
        return _abort_on_partition(args)
    if args.transactional_id is None:
        raise InvalidConfigError(
            "give --transactional-id ID, or --topic T --partition P with --producer-id or "
            "--start-offset"
        )
    if any(v is not None for v in (args.partition, args.producer_id, args.start_offset)):
        raise InvalidConfigError(
            "--partition, --producer-id, --start-offset go with --topic, not --transactional-id"
        )
    with _client(args) as client:
        aborted = client.abort_transaction(args.transactional_id)
    print(
        f"aborted the open transaction of {args.transactional_id}; its holder is fenced"
        if aborted
        else f"{args.transactional_id} has no open transaction: nothing aborted"
    )
    return 0


def topics_delete(args: argparse.Namespace) -> int:
    with _client(args) as client:
        client.delete_topic(args.topic)
    print(f"deleted topic {args.topic}")
    return 0


def fill_broker(broker: argparse.ArgumentParser) -> None:
    """Fill ``idemlog broker``'s parser (its subcommands ``start``, ``list``, ``stop``)."""
    broker_sub = broker.add_subparsers(dest="action", required=True)
    start = broker_sub.add_parser("start", help="serve until SIGTERM/SIGINT")
    start.add_argument("--config", required=True, help="a .properties file of broker keys")
    start.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a broker key, over the file (repeatable)",
    )
    # Internal (spark_sink.embedded's launcher): accepted, never listed in --help. Once
    # serving, the broker writes host:port and a newline to this inherited descriptor and
    # closes it, so a launcher waits on a pipe: EOF without an address means it died first.
    start.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)
    start.set_defaults(func=broker_start)
    add_hosted_commands(broker_sub)


def fill_topics(topics: argparse.ArgumentParser) -> None:
    """Fill ``idemlog topics``'s parser."""
    topics_sub = topics.add_subparsers(dest="action", required=True)
    create = topics_sub.add_parser("create", help="create a topic")
    _broker_arguments(create)
    create.add_argument("--topic", required=True, help="the new topic's name")
    create.add_argument(
        "--partitions", type=int, default=1, help="how many partitions (default: 1)"
    )
    create.add_argument("--schema", help='Arrow schema as "name:type,..." (e.g. id:int64)')
    create.add_argument(
        "--config", action="append", default=[], metavar="KEY=VALUE", help="topic override"
    )
    create.set_defaults(func=topics_create)
    describe = topics_sub.add_parser(
        "describe", help="topics' partitions, replicas, ISR and offsets"
    )
    _broker_arguments(describe)
    describe.add_argument("--topic", help="only this topic")
    describe.add_argument("--json", action="store_true", help=JSON_HELP)
    describe.set_defaults(func=topics_describe)
    elect = topics_sub.add_parser(
        "elect-leaders", help="give each partition back to its preferred (first) replica"
    )
    _broker_arguments(elect)
    elect.add_argument("--topic", help="only this topic")
    elect.add_argument("--json", action="store_true", help=JSON_HELP)
    elect.set_defaults(func=topics_elect_leaders)
    delete = topics_sub.add_parser("delete", help="delete a topic and its data")
    _broker_arguments(delete)
    delete.add_argument("--topic", required=True, help="the topic to delete")
    delete.set_defaults(func=topics_delete)


def fill_transactions(txns: argparse.ArgumentParser) -> None:
    """Fill ``idemlog transactions``'s parser."""
    txns_sub = txns.add_subparsers(dest="action", required=True)
    tlist = txns_sub.add_parser("list", help="open transactions, oldest first")
    _broker_arguments(tlist)
    tlist.add_argument(
        "--min-age-ms", type=int, default=0, help="only those open at least this long"
    )
    tlist.add_argument(
        "--all",
        action="store_true",
        help="every transactional id the coordinator keeps, in any state, with its last "
        "update (ids idle past transactional.id.expiration.ms disappear)",
    )
    tlist.add_argument("--json", action="store_true", help=JSON_HELP)
    tlist.set_defaults(func=transactions_list)
    thang = txns_sub.add_parser(
        "find-hanging",
        help="transactions open on a partition that no coordinator knows (they hold the "
        "partition's last stable offset)",
    )
    _broker_arguments(thang)
    thang.add_argument("--topic", help="only this topic (default: every non-internal topic)")
    thang.add_argument(
        "--older-than-ms",
        type=int,
        default=DEFAULT_HANGING_MS,
        help="only those whose producer wrote nothing for this long (default "
        f"{DEFAULT_HANGING_MS}, transaction.max.timeout.ms's default: no live transaction "
        "is open longer)",
    )
    thang.add_argument("--json", action="store_true", help=JSON_HELP)
    thang.set_defaults(func=transactions_find_hanging)
    tabort = txns_sub.add_parser(
        "abort",
        help="fence an id's holder and abort what it has open (--transactional-id), or abort "
        "one producer's hanging transaction on one partition (--topic --partition)",
    )
    _broker_arguments(tabort)
    tabort.add_argument("--transactional-id", help="the id whose transaction to abort")
    tabort.add_argument("--topic", help="the partition's topic (a hanging transaction)")
    tabort.add_argument("--partition", type=int, help="the partition (with --topic)")
    tabort.add_argument("--producer-id", type=int, help="the producer whose transaction to abort")
    tabort.add_argument(
        "--producer-epoch",
        type=int,
        help="only if the producer is still at this epoch (as find-hanging showed it)",
    )
    tabort.add_argument(
        "--start-offset", type=int, help="the transaction that starts at this offset"
    )
    tabort.set_defaults(func=transactions_abort)
