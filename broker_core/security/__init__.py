"""Authentication: SCRAM over Flight's handshake, the credential stores, principals."""
