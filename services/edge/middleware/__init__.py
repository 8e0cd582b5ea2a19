"""The edge's aiohttp middlewares, one module per name in ``pipeline.MIDDLEWARE_ORDER``
(outermost first): ``telemetry`` → ``error_boundary`` → ``ip_guard``. They wrap every route;
the chat stages run inside them."""
