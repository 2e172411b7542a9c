"""The broker client: connections, requests, the produce stream. Used by the Spark side,
the jobs, the CLI and by a broker talking to another. Never imports ``log``, ``txn``,
``cluster`` or ``server``: it speaks the ``protocol`` only."""
