"""Cluster metadata: topics, their partition leaders and the controller, embedded (one
broker, a file) or in ZooKeeper. Depends on ``log`` and below."""
