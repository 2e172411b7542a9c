"""Names of a package that load their module on first use (PEP 562 ``__getattr__``).

Spark imports the sink's modules in every Python process it starts, and the producer is
used without Spark: a package's ``__init__`` that imported all its names would load
pyspark, or the producer's whole sender, where neither is needed.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, homes: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``name`` is looked up in the module
    ``homes[name]`` (absolute, or relative to ``package`` when it starts with a dot) the
    first time it is asked for; an unknown name raises AttributeError."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(home, package), name)

    return __getattr__
