"""Engine time, counted in the engine core's own steps: a bound on how soon a cancelled stream
stops running that holds on a loaded box. Wall-clock bounds (100 ms) measure the machine as
much as the code: on a box shared with other work a cancellation that takes 8 ms and 2 steps
when quiet was seen at 111 ms, while a stream that is *not* aborted keeps running for as many
steps as it has tokens left (about 200 in these tests)."""

from __future__ import annotations

from typing import Any

from services.worker.vllm.engine import VllmEngine

#: Engine steps after which a stream the engine itself was asked to drop no longer runs.
MAX_STEPS_TO_ABORT = 5
#: The same through the whole stack (client → edge → gRPC → worker → engine): a few more
#: steps pass while the disconnect travels. Far below the ~200 of a stream left running.
MAX_STEPS_TO_ABORT_THROUGH_THE_STACK = 25


class StepCounter:
    """Counts the engine steps whose scheduler state the engine's load window sees from now
    on (one per step of vLLM's engine core), until :meth:`stop`."""

    def __init__(self, engine: VllmEngine) -> None:
        self._window = engine._window  # the engine core's own feed
        self._observe = self._window.observe_scheduler
        self.after = 0

        def counted(**fields: Any) -> None:
            self.after += 1
            self._observe(**fields)

        self._window.observe_scheduler = counted  # type: ignore[method-assign]

    def stop(self) -> int:
        """Stops counting; the steps seen."""
        self._window.observe_scheduler = self._observe  # type: ignore[method-assign]
        return self.after
