"""Kafka consumer groups (the classic protocol), independent of the broker.

``state`` is the group's state machine, ``group`` one group's members and protocol
choice, ``records`` the rows of ``__consumer_offsets``, ``coordinator`` the coordinator of
one ``__consumer_offsets`` partition (JoinGroup .. DeleteGroups and the offsets). The
broker places coordinators on the partitions' leaders and fences their appends
(``broker_core.server.coordination.group_coordinators``); docs/kafka.md, "Consumer groups".
"""
