"""Producer-id blocks: the record and the leasing rules (``block``), the embedded broker's
file-backed source and the cluster's ZooKeeper-leased one, and the manager that hands ids
out of the current block (docs/design.md §5)."""
