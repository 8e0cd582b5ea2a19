"""Engine time, counted in the engine core's own steps: a bound on how soon a cancelled stream
stops running that holds on a loaded box. Wall-clock bounds (100 ms) measure the machine as
much as the code: on a box shared with other work a cancellation that takes 8 ms and 2 steps
when quiet was seen at 111 ms, while a stream that is *not* aborted keeps running for as many
steps as it has tokens left (about 200 in these tests)."""

from __future__ import annotations

from typing import Any

from services.worker.vllm.engine import VllmEngine

#: Engine steps after which a stream the engine itself was asked to drop no longer runs:
#: 1–2 on a quiet box, but 50 once in a clean clone's full run on a loaded 2-core box (the
#: engine core process kept stepping while this process, which sends the abort, waited for
#: a core). Still far below the ~200 steps of a stream left running.
MAX_STEPS_TO_ABORT = 60
#: The same through the whole stack (client → edge → gRPC → worker → engine): a few more
#: steps pass while the disconnect travels (3 on a quiet box).
MAX_STEPS_TO_ABORT_THROUGH_THE_STACK = 80


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
