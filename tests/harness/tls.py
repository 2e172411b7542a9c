"""The session's TLS certificates as a fixture (:func:`testkit.tls.make_certs`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testkit.tls import TlsCerts, make_certs


@pytest.fixture(scope="session")
def tls_certs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsCerts]:
    """The session's certificates (see the module docstring)."""
    yield make_certs(tmp_path_factory.mktemp("tls"))
