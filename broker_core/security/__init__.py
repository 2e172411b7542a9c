"""Security of the links and of the principals: TLS settings and the construction of
every Flight client and server location (``tls.py``), the diagnosis of a link that failed
its TLS handshake (``tls_probe.py``), ZooKeeper's TLS (``zk_tls.py``); SASL authentication:
SCRAM over Flight's handshake (``scram.py``, ``flight_auth.py``, ``sessions.py``), the
credential stores (``credentials.py``), principals (``principal.py``) and the client's
``sasl.*`` keys (``client_config.py``). A layer beside ``log``: it imports only
``protocol`` and the base modules, never a client or server layer (docs/architecture.md,
docs/security.md)."""
