"""The real engine: vLLM's ``AsyncLLM`` behind the worker's ``Engine`` seam.

- :mod:`.options`     ``--engine vllm`` flags → :class:`VllmConfig` (no vllm import)
- :mod:`.config`      ``VllmConfig``: validated, frozen; becomes vLLM's ``AsyncEngineArgs``
- :mod:`.engine`      ``VllmEngine``: life cycle, generate, abort, load (imports vllm)
- :mod:`.request`     fail-fast checks of a request, naming the OpenAI field
- :mod:`.prompt`      chat messages → prompt token ids under the model's chat template
- :mod:`.output`      vLLM's streamed deltas → ``EngineOutput``
- :mod:`.stats`       vLLM's per-step stats → :class:`LoadWindow`; vLLM's own Prometheus
  metrics off unless ``--engine-metrics`` (imports vllm)
- :mod:`.load_window` running/waiting/KV use plus recent-window rates, for load reports
- :mod:`.tinymodel`   a tiny random-weight Llama built locally (``python -m
  services.worker.vllm.tinymodel DIR``), so the real path runs without a hub

Nothing here is imported by a simulated worker: ``engine_factory`` imports this package only
for ``--engine vllm``.
"""
