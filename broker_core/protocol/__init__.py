"""The wire contract shared by the client and the server: actions, typed requests and
responses, their encoding and validation, the error encoding, topic naming rules and the
metrics document. Depends on ``record`` and the base modules only."""
