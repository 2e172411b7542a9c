"""What the coordinator persists: the records (``records``: Kafka's transaction state
machine, a transactional id's metadata, a sink's commit and batch records), the
``__transaction_state`` topic's schema and its upgrade (``schema``), the store over one
state partition (``store``), and the reader of the legacy ZooKeeper state the one-way
migration needs (``legacy_zk``)."""
