"""What the edge serves to people: the chat page at ``/`` and the operators' fleet map at
``/console`` (see README.md in this folder).

    static/      the pages, their scripts and styles, vendored libraries, the world map
    config.py    WebConfig: places on the map, session lifetime, console limits
    assets.py    AssetStore: files read once, ETag, gzip, versioned URLs, security headers
    sessions.py  ConsoleSessions: admin token → an HttpOnly session cookie (Redis)
    feed.py      FleetHub: one router WatchFleet stream fanned out to bounded mailboxes
    payloads.py  the router's view and decisions as the console's JSON; events from diffs
    explain.py   GET /v1/explanations/{request_id}: the router's explanation for one request
    routes.py    the routes, added beside the API's; nothing here is on the chat path
"""
