"""A campaign of seeded fault schedules, outside the test suite: ``make chaos SEEDS=N``.

    python -m tests.chaos --seeds 100 [--first 1] [--steps 8]

Runs the seeded schedule of ``tests/broker/test_replication_schedule.py`` (kills, clean
stops, pauses shorter and longer than the session, cut links, aimed at data partitions'
leaders and followers, the controller and the sink's transaction coordinator, over three
replicating brokers and a real ZooKeeper, with an idempotent producer, a sink and a
plain transactional producer writing; the sink's invariants checked too) for seeds
``first .. first + seeds - 1``, one pytest run per seed so that one seed's failure never
hides the next, and ends with one line::

    chaos seeds=N failed=F passed=P seconds=S failed_seeds=a,b,...

Exit status 1 when a seed failed; each failed seed's report (its steps and the command
that replays it) is in ``<dir>/seed-<n>.log``, named on the way.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCHEDULE_TEST = (
    "tests/broker/test_replication_schedule.py::test_randomized_fault_schedule_keeps_the_invariants"
)


def run_seed(seed: int, steps: int, log_dir: Path) -> bool:
    """One seed in its own pytest process; True when it passed."""
    env = dict(os.environ)
    env["IDEMLOG_SCHEDULE_SEEDS"] = str(seed)
    env["IDEMLOG_SCHEDULE_STEPS"] = str(steps)
    env.setdefault("PYTHONPATH", str(ROOT))
    log = log_dir / f"seed-{seed}.log"
    with open(log, "w") as out:
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-s", SCHEDULE_TEST],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    # pytest's 5 (no test collected) is a failure here: the seed did not run.
    return result.returncode == 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10, help="how many seeds to run")
    parser.add_argument("--first", type=int, default=1, help="the first seed")
    parser.add_argument("--steps", type=int, default=8, help="faults per seed")
    parser.add_argument("--dir", type=Path, default=ROOT / "bench" / "chaos", help="seed logs")
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.steps < 1:
        parser.error(f"--seeds and --steps must be >= 1 (got {args.seeds}, {args.steps})")
    args.dir.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    failed: list[int] = []
    seeds = range(args.first, args.first + args.seeds)
    for n, seed in enumerate(seeds, 1):
        ok = run_seed(seed, args.steps, args.dir)
        if not ok:
            failed.append(seed)
        verdict = "passed" if ok else f"FAILED (report: {args.dir / f'seed-{seed}.log'})"
        print(f"seed {seed} ({n}/{args.seeds}) {verdict}", flush=True)
    print(
        f"chaos seeds={args.seeds} failed={len(failed)} passed={args.seeds - len(failed)} "
        f"seconds={time.monotonic() - began:.0f} "
        f"failed_seeds={','.join(map(str, failed)) or '-'}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
