"""The chat pipeline's stages, one module per name in ``pipeline.CHAT_STAGE_ORDER``.

| order | stage              | module                | answers itself with                     |
|------:|--------------------|-----------------------|-----------------------------------------|
| 1     | ``connection_guard`` | ``connection_guard.py`` | 503 draining, 429/503 too many streams |
| 2     | ``authenticate``   | ``authenticate.py``   | 401                                     |
| 3     | ``validate``       | ``validate.py``       | 400 naming the field, 404 model, 413, 408 |
| 4     | ``admit``          | ``admit.py``          | 429 with ``Retry-After`` (rate limits)  |
| 5     | ``route``          | ``route.py``          | 503 / 429 (no capacity), 400 (residency) |
| 6     | ``stream``         | ``stream.py``         | terminal: SSE chunks or one completion  |

Each is a small class with a ``name`` and keyword-only dependencies; ``app.chat_stages``
builds them and ``pipeline.build_chain`` refuses any other order.
"""
