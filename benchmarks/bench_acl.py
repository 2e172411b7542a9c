"""What an ACL check costs: ``python -m benchmarks.bench_acl``.

One check per request (and per produce batch) on a broker with ``authorizer.enable``:
``Authorizer.authorize`` over a plain scan of every binding and over the ``AclIndex`` a
broker builds once per ACL set, for 10 to 10,000 bindings (one allowing the asked
resource, the others naming other topics). In-process, no broker; prints a table and
``name=value`` lines; asserts nothing.
"""

from __future__ import annotations

import timeit

from broker_core.security.acl import (
    AclBinding,
    AclIndex,
    Authorizer,
    Operation,
    PatternType,
    Resource,
    ResourcePattern,
    ResourceType,
)
from broker_core.security.principal import Principal

SIZES = (10, 100, 1_000, 10_000)


def _bindings(n: int) -> list[AclBinding]:
    def topic(name: str) -> ResourcePattern:
        return ResourcePattern(ResourceType.TOPIC, PatternType.LITERAL, name)

    others = [
        AclBinding.of(topic(f"t{i}"), Principal.user(f"u{i}"), Operation.WRITE)
        for i in range(n - 1)
    ]
    return [*others, AclBinding.of(topic("payments"), Principal.user("alice"), Operation.WRITE)]


def _per_check_us(authorizer: Authorizer, acls: object, budget_s: float = 0.3) -> float:
    alice, pay = Principal.user("alice"), Resource(ResourceType.TOPIC, "payments")

    def check() -> bool:
        return authorizer.authorize(acls, alice, "127.0.0.1", Operation.WRITE, pay)  # type: ignore[arg-type]

    assert check()
    timer = timeit.Timer(check)
    number, _ = timer.autorange()
    runs = max(1, int(budget_s / (timer.timeit(number) / number) / number))
    return min(timer.repeat(3, number * runs)) / (number * runs) * 1e6


def main() -> None:
    authorizer = Authorizer([], allow_if_no_acl=False)
    print("| bindings | scan (us per check) | index (us per check) |")
    print("|---|---|---|")
    lines = []
    for n in SIZES:
        bindings = _bindings(n)
        scan = _per_check_us(authorizer, tuple(bindings))
        index = _per_check_us(authorizer, AclIndex(bindings))
        print(f"| {n} | {scan:.1f} | {index:.1f} |")
        lines.append(f"acl_check_us_scan_{n}={scan:.2f}\nacl_check_us_index_{n}={index:.2f}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
