"""Cluster metadata: the brokers, the controller, the topics and where their partitions
live and who leads them, embedded (one broker, a file) or in ZooKeeper. Depends only on
the layers below it (``log``, ``security``, ``protocol``, the base modules)."""
