"""Security of the links and, later, of the principals: TLS settings and the construction
of every Flight client and server location (``tls.py``), the diagnosis of a link that
failed its handshake (``tls_probe.py``). A base package: it imports no layer
(docs/architecture.md, docs/security.md)."""
