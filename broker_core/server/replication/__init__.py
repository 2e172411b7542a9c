"""Replication: the partitions a broker holds (leader or follower, the ISR, the high
watermark), the replica manager that makes and unmakes them, the fetchers that copy from
leaders, and the check of a request's topic id (docs/replication.md)."""
