"""idemlog broker side: the log store, validator, producer state and recovery."""

# What a message tells a user who lacks the [spark] extra. idemlog is on no package index
# (`make dist` builds its wheel), so the install line names the wheel, not a package name.
SPARK_EXTRA = "idemlog's [spark] extra: pip install '<the idemlog wheel>[spark]'"
