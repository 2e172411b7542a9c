"""Access: who a caller is (SASL, mutual TLS, the local token) and what it may do (ACLs)
(docs/security.md)."""
