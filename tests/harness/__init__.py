"""Test harnesses shared by several test packages."""
