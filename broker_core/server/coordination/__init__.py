"""Coordination placement: which broker's transaction coordinator serves a key (the leader
of the key's ``__transaction_state`` partition), the coordinator each state-partition leader
starts and fences by that partition's leader epoch (the embedded broker's one coordinator
too), the topic's creation and the one-way migration from ZooKeeper, the marker writer, and
a leader's check of a transactional batch with its coordinator (docs/design.md §10)."""
