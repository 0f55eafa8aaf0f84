"""What a pool measures of memory: this process's peak RSS (:class:`MemoryMeter`, a sampling thread)
and the peak CUDA memory torch allocated (:func:`cuda_peak_bytes`); the pools report both."""

from __future__ import annotations

import sys
import threading
from typing import Any


class MemoryMeter:
    """Samples this process's RSS (psutil) every ``interval_s`` in a daemon thread and keeps the
    peak; ``peak_rss`` also folds in a sample taken at the moment it is read."""

    def __init__(self, interval_s: float = 0.02) -> None:
        self.interval_s = interval_s
        self.peak_rss = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc: Any = None

    def start(self) -> None:
        if self._thread is not None:
            return
        try:
            import psutil
        except ImportError:  # pragma: no cover - psutil is a dependency of ray and installed in CI
            return
        self._proc = psutil.Process()
        self.sample()
        self._thread = threading.Thread(target=self._run, name="drmas-pool-meter", daemon=True)
        self._thread.start()

    def sample(self) -> int:
        if self._proc is None:
            return self.peak_rss
        rss = int(self._proc.memory_info().rss)
        self.peak_rss = max(self.peak_rss, rss)
        return rss

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def stop(self) -> None:
        self.sample()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        self._thread = None


def cuda_peak_bytes() -> int | None:
    """``torch.cuda.max_memory_allocated`` summed over visible devices; ``None`` without CUDA (or
    when torch was never imported: the pool does not import it for you)."""

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    return int(sum(torch.cuda.max_memory_allocated(i) for i in range(torch.cuda.device_count())))
