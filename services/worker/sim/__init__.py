"""The simulated inference engine: a performance model of a GPU server running vLLM.

- :mod:`.config`     ``SimConfig`` (the cost model's knobs) and ``SimConfigError``
- :mod:`.text`       chat template, deterministic tokenizer and text generator
- :mod:`.kv`         KV-cache blocks with automatic prefix caching
- :mod:`.sequence`   one request: tokens, finish rules, outputs
- :mod:`.validation` request checks and seeds
- :mod:`.scheduler`  ``SimScheduler``: continuous batching as pure, synchronous steps
- :mod:`.engine`     ``SimEngine``: the async ``Engine`` that runs the scheduler in real time
"""

from services.worker.sim.config import SimConfig, SimConfigError
from services.worker.sim.engine import SimEngine
from services.worker.sim.scheduler import SimScheduler, StepPlan, StepResult

__all__ = ["SimConfig", "SimConfigError", "SimEngine", "SimScheduler", "StepPlan", "StepResult"]
