"""The partitioned log store: segments and their indexes, producer state and its
snapshots, the validator, a partition log and its recovery, the store of topics.

Depends on ``protocol``, ``record`` and the base modules; knows nothing of transactions'
coordinators, the cluster, the server or the client."""
