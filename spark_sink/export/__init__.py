"""Copies of a topic's committed rows into other stores: ``delta`` (``idemlog export delta``,
docs/jobs.md). Each needs the ``[spark]`` extra."""
