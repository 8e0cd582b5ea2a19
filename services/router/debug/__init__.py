"""The router's debug endpoint for operators (``--debug-port``).

- :mod:`.endpoint`  ``DebugEndpoint``: the HTTP routes, their auth and parameter checks
- :mod:`.payloads`  the fleet, decisions and timings as JSON-able dicts (proto field names)
"""

from services.router.debug.endpoint import DebugConfig, DebugEndpoint

__all__ = ["DebugConfig", "DebugEndpoint"]
