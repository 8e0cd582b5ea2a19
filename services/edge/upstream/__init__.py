"""The edge's upstreams: where a request goes and how its tokens come back.

- :mod:`.router_client`    ``RouterClient``: Route, ListModels, GetView; outcome reports batched
- :mod:`.resilient_router` ``ResilientRouter``: the router, or its last view while it is down
- :mod:`.worker_pool`      ``WorkerPool``: one warm channel per worker; ``Generate`` calls
- :mod:`.protos`           the Route and Generate requests, built fresh from one request context
- :mod:`.failover`         ``open_stream``: try ranked candidates until one yields a first token
"""
