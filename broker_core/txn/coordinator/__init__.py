"""The transaction coordinator (``coordinator.TransactionCoordinator``) and the parts it
holds, each owning its state (docs/architecture.md, "The transaction coordinator's parts"): the id
registry with its index and claims, the lifecycle, sink runs and operations, the durable
steps, counters, markers and their sender, read visibility, housekeeping and expiry."""
