"""Kafka's data formats, pure and without I/O: what the Kafka listener (issue 39) puts on
the wire and reads from it. ``record_batch``: the record-batch v2 format ("magic 2") that
every current Kafka client reads and writes, encoded from and decoded into Arrow columns;
``varint``: its zigzag varints over whole numpy columns; ``compression``: the codecs a
batch's records may be compressed with; ``json_records``: rows of any schema as Kafka
records (a topic's ``kafka.format``).

Sits beside ``broker_core.protocol`` (idemlog's own Flight contract), above
``broker_core.record``, whose constants and control-record types it shares."""
