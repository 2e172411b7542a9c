"""When this process first imported ``spark_sink``, for the micro-batch breakdown
(``benchmarks.trace_hooks``): ``benchmarks.bench_microbatch`` puts this folder on the
``PYTHONPATH`` Spark's Python processes inherit, so Python imports this module at start-up,
before pyspark and the sink. A finder first on ``sys.meta_path`` notes the moment
``spark_sink`` is looked up, then leaves (it finds nothing itself). Not a package: a
folder of its own, so nothing else of the benchmarks lands on that path.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

SPARK_SINK_IMPORTED: float | None = None  # epoch seconds; None: not imported yet


class _Clock:
    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        global SPARK_SINK_IMPORTED
        if name == "spark_sink":
            SPARK_SINK_IMPORTED = time.time()
            sys.meta_path.remove(self)
        return None


sys.meta_path.insert(0, _Clock())
