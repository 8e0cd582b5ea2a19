"""What differs between the edge's OpenAI endpoints, behind one small interface.

Every endpoint passes the same declared stages (services/edge/pipeline.py): connection guard,
authenticate, validate, admit, route, then a terminal. What the shared stages need to know of
an endpoint is a :class:`~services.edge.dialects.base.Dialect`: how to parse and bound its
body (validate), how many tokens to reserve beyond the prompt (admit), and what to ask the
router (route). The terminal stage is the endpoint's own (stream for chat and completions,
embed for embeddings) and renders the endpoint's response shape.

- :mod:`.chat`         POST /v1/chat/completions
- :mod:`.completions`  POST /v1/completions
- :mod:`.embeddings`   POST /v1/embeddings
"""
