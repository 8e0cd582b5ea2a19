"""Rate limits per key and per tenant: requests/min, tokens/min, concurrent streams.

``types`` (what is asked and answered), ``window`` (the algorithm, in process: the local
fallback and the executable specification of the Lua script), ``redis_backend`` (the same
algorithm as one atomic Lua script per request), ``limiter`` (the policy around them: local
deny cache, breaker, fail-open/closed, leases) and ``headers`` (OpenAI's x-ratelimit-*).
"""
