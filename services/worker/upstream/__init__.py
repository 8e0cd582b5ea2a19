"""``--engine openai``: a worker that fronts an existing OpenAI-compatible server.

Users with a fleet of ``vllm serve`` (or SGLang, or any OpenAI-compatible) servers put one
Meridian worker beside each and adopt Meridian's edge and router without moving them.

- :mod:`.options`  the worker's command line → :class:`UpstreamConfig` → :class:`UpstreamEngine`
- :mod:`.config`   ``UpstreamConfig``: the validated, frozen settings
- :mod:`.sse`      an incremental Server-Sent-Events parser (bytes in, ``data`` payloads out)
- :mod:`.wire`     ``EngineRequest`` → the upstream's JSON body; its chunks → ``EngineOutput``
- :mod:`.errors`   the upstream's HTTP errors → Meridian's error tree
- :mod:`.scrape`   running/waiting/KV use from a vLLM upstream's ``/metrics`` (optional)
- :mod:`.telemetry` the ``worker.upstream`` span, upstream metrics and log lines
- :mod:`.engine`   ``UpstreamEngine``: models at start-up, streaming, cancellation, load
"""
