"""The broker process, in rooms by concern, each importing only the ones below it
(docs/architecture.md, "The layers"):

* ``process``: the broker started and stopped, its wiring, background tasks, ZooKeeper
  session and idle shutdown;
* ``requests``: the Flight server and the request handlers;
* ``kafka``: the Kafka listener, Kafka's protocol beside the Flight one (neither imports
  the other);
* ``coordination``: which transaction coordinator serves a key, the
  ``__transaction_state`` partitions' leaders starting theirs, the marker writer, the
  leaders' check of a transactional batch with its coordinator, the
  ``__consumer_offsets`` partitions' group coordinators, the stable cut Kafka consumers
  read to;
* ``replication``: the partitions a broker holds, leaders and followers, the fetchers;
* ``observability``: the metrics and their Prometheus endpoint;
* ``access``: who a caller is and what it may do;
* ``config``: the broker's keys, declared once.

``hooks`` (the test hooks' interface, no-op by default) is asked by several rooms and
imports none."""
