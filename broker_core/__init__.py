"""idemlog broker side: the log store, validator, producer state and recovery."""
