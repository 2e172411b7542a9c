"""Benchmarks, run by hand or through the Makefile (``make bench-store``); not part of CI."""
