"""The step's phase timers: wall seconds under verl's names (``timing_s/gen``, ...) and beside each the
trainer process's CPU seconds (``cpu_s/gen``, ...; every thread of this process, so with ``--local``
all of the work, under Ray only the driver's). On a shared machine the wall time of a phase grows
with the load while its CPU seconds do not: scripts/bench_plan.py sets the hours model beside both.

    clock = PhaseClock()
    clock.start(); ...; clock.stop(metric_names.TIME_GEN)
    record.update(clock.record)      # {"timing_s/gen": 1.2, "cpu_s/gen": 1.1}
"""

from __future__ import annotations

import time

from drmas_trainer import metric_names


class PhaseClock:
    """Wall and CPU seconds of consecutive phases, into :attr:`record`."""

    def __init__(self) -> None:
        self.record: dict[str, float] = {}
        self._t = (time.perf_counter(), time.process_time())

    def start(self) -> None:
        self._t = (time.perf_counter(), time.process_time())

    def stop(self, name: str) -> float:
        """Record the phase ``name`` (a ``timing_s/...`` name) since :meth:`start`; its wall seconds."""
        wall = time.perf_counter() - self._t[0]
        self.record[name] = wall
        self.record[metric_names.cpu(name)] = time.process_time() - self._t[1]
        return wall
