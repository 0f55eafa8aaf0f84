"""Weight streams for ``engine.update_weights``: ``(name, tensor)`` pairs, consumed lazily in buckets.

    async for bucket in buckets(model.named_parameters(), 1 << 30):   # ~1 GiB per bucket
        send(bucket)

- ``buckets(pairs, bucket_bytes)``: consecutive lists of about ``bucket_bytes`` (a larger tensor
  is a bucket of its own); ``pairs`` may be a list, a generator or an async iterable, and is pulled
  only as far as the current bucket needs, so a generator of fresh copies never holds more than
  one bucket.
- ``tensor_nbytes(t)``: ``numel x element_size``.
"""

from __future__ import annotations

from typing import Any, AsyncIterator

DEFAULT_BUCKET_BYTES = 1 << 30


def tensor_nbytes(t: Any) -> int:
    """Bytes of a tensor (``numel * element_size``), 0 for anything else."""
    try:
        return int(t.numel()) * int(t.element_size())
    except AttributeError:
        return 0


async def iterate(items: Any) -> AsyncIterator[Any]:
    """A sync or async iterable, as an async iterator."""
    if hasattr(items, "__aiter__"):
        async for item in items:
            yield item
    else:
        for item in items:
            yield item


async def buckets(named_tensors: Any, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> AsyncIterator[list[tuple[str, Any]]]:
    """``(name, tensor)`` pairs in consecutive lists of about ``bucket_bytes`` each (module docstring)."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    bucket: list[tuple[str, Any]] = []
    size = 0
    async for name, t in iterate(named_tensors):
        n = tensor_nbytes(t)
        if bucket and size + n > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += n
    if bucket:
        yield bucket
