"""Who may call the edge, and what they may do: tenants, API keys, and how a request proves it.

- :mod:`.tenants`    ``Tenant``: tier, allowed models and regions, limits (pydantic-validated)
- :mod:`.apikeys`    the key format, HMAC-SHA256 with a pepper, ``KeyRecord``
- :mod:`.directory`  tenants and keys in Redis: create, rotate, revoke; invalidations by pub/sub
- :mod:`.auth`       ``Authenticator``: bearer key → ``Principal`` (cached, fail-open or closed)
- :mod:`.cli`        ``python -m services.edge.tenancy``: manage them through the admin API

The admin API itself (``services/edge/admin.py``) serves the directory on its own port.
"""
