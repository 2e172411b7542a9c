"""Runnable jobs: demos, exports, verification tools."""
