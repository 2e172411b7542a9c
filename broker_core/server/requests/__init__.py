"""Requests: the Flight server (produce and fetch streams, the actions' dispatch) and one
handler per action, each answering a typed response (docs/protocol.md)."""
