"""The edge gateway: OpenAI-compatible HTTP API, auth, limits, routing and streaming."""
