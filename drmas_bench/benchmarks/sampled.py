"""The reference's sampled validation sets, built here: ``drmas-bench data prepare --sampled``.

The reference validates during training on ``test_sampled.parquet``, made by its data preparation
from the first rows, in file order, of each source (search: the first 30 rows of each of its 7
sources, 210; math: the first 50 of MATH500 (data_source ``math500_first50``), then AIME24 and
AIME25 whole, 110). A suite declares such a set as a benchmark of split ``val`` with a
:class:`~drmas_bench.benchmarks.base.Sampled` (its parts and the reference's row layout). This module
takes those first rows from the local copies of the sources, writes them as the reference writes
them (its columns: ``data_source``, ``prompt``, ``reward_model``, ``extra_info``, ...) to the
benchmark's file under the data dir, and the benchmark reads that file like any other; the
reference's own ``test_sampled.parquet`` put at the same path is read the same way.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drmas_bench.benchmarks.catalog import (
    Benchmark,
    get_benchmark,
    known_names,
    load_tasks,
    resolve_data_dir,
    source_of,
)
from drmas_bench.types import UserError


@dataclass
class Built:
    """One validation set written: its benchmark, the file, rows per data_source, and notes on
    sources whose local copy is partial (their first rows need not be the reference's)."""

    benchmark: Benchmark
    path: Path
    counts: Counter
    notes: list[str]
    kept: bool = False  # its file was there already and is left as it is (no --force): nothing was written


def sampled_sets(suite: str | None = None) -> list[Benchmark]:
    """The registered validation sets (split ``val``), of ``suite`` or of every suite."""
    return [b for b in map(get_benchmark, known_names()) if b.sampled is not None and suite in (None, b.suite)]


def sampled_rows(b: Benchmark, data_dir: str | os.PathLike | None) -> tuple[list[dict[str, Any]], list[str]]:
    """The set's rows in the reference's layout, from the first rows of each source (local copy,
    else the hub), and the notes on partial sources. A source with fewer rows than asked is an error."""
    if b.sampled is None:
        raise UserError(f"{b.name} is not a sampled validation set")
    d = resolve_data_dir(data_dir)
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    for src, n, source in b.sampled.parts:
        sb = get_benchmark(src)
        tasks = load_tasks(sb, d, limit=n)
        if n is not None and len(tasks) < n:
            raise UserError(f"{b.name}: {src} has {len(tasks)} rows; the reference's set takes its first {n}")
        _, partial = source_of(sb, d)
        if partial:
            notes.append(f"{src}: {partial}; its first rows need not be the reference's")
        rows.extend(b.sampled.row(t, source, i) for i, t in enumerate(tasks))
    return rows, notes


def write_parquet(rows: list[dict[str, Any]], path: Path) -> None:
    """``rows`` as one Parquet file (nested columns as structs and lists), written atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    os.replace(tmp, path)


def prepare_sampled(data_dir: str | os.PathLike | None, out: str | os.PathLike | None = None,
                    suite: str | None = None, force: bool = False) -> list[Built]:
    """Build every validation set of ``suite`` (or all) from the sources under ``data_dir`` into
    ``out`` (default: ``data_dir`` itself), each at its benchmark's file path. An existing file (an
    earlier build, or the reference's own) is kept unless ``force`` (its entry says ``kept``); a
    suite without a sampled set gives an empty list."""
    d = resolve_data_dir(data_dir)
    root = Path(out) if out is not None else d
    if root is None:
        raise UserError("data prepare --sampled needs a data dir to read the sources from and write into "
                        "(--data-dir or $DRMAS_DATA_DIR), or --out for where to write")
    sets = sampled_sets(suite)
    targets = [(b, root / b.files[0]) for b in sets]
    built = []
    for b, path in targets:  # all rows first: a source that fails leaves no half-written set behind
        if path.exists() and not force:  # an earlier build, or the reference's own file: kept as it is
            built.append(Built(b, path, Counter(), [], kept=True))
            continue
        rows, notes = sampled_rows(b, d)
        write_parquet(rows, path)
        built.append(Built(b, path, Counter(r["data_source"] for r in rows), notes))
    return built
