"""FAKE ``sglang.srt.utils`` (tests only): ``MultiprocessingSerializer`` with the real names.

The real one pickles with torch's multiprocessing reductions (CUDA IPC handles, shared memory), so a
payload refers to tensors owned by the sending process. The fake keeps that property without
pickling tensors: ``serialize`` parks the object in this process and returns a handle;
``deserialize`` of a handle from another process fails, like a stale IPC handle would.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

_PARKED: dict[bytes, Any] = {}
_IDS = itertools.count(1)


class MultiprocessingSerializer:
    @staticmethod
    def serialize(obj: Any, output_str: bool = False) -> Any:
        handle = f"fake-ipc:{os.getpid()}:{next(_IDS)}".encode()
        _PARKED[handle] = obj
        return handle.decode() if output_str else handle

    @staticmethod
    def deserialize(data: Any) -> Any:
        key = data.encode() if isinstance(data, str) else bytes(data)
        if key not in _PARKED:
            raise RuntimeError(f"FAKE sglang: stale or foreign tensor handle {key!r}")
        return _PARKED.pop(key)
