"""What a benchmark is and how it is registered: the leaf every suite's ``benchmarks.py`` imports.

``Benchmark`` (one entry per benchmark), ``register`` (adds it to ``BENCHMARKS``, under a suite of
``suites.registry.SUITES``), and the small record helpers the suites' ``to_task`` functions share.
Loading, selecting and the hub live in ``benchmarks.catalog``; the suites import only this module
(through ``drmas_bench.suite``), so nothing imports back.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

from drmas_bench.registry import DeclarationError, Registry
from drmas_bench.suites.registry import SUITES
from drmas_bench.types import Task


@dataclass(frozen=True)
class HubSource:
    """Where the reference loads a benchmark from on the Hugging Face hub."""

    path: str  # e.g. "HuggingFaceH4/MATH-500"
    split: str = "test"
    config: str | None = None
    # rows of a mixed dataset that belong to this benchmark (e.g. Search-R1's `data_source`)
    filter_field: str | None = None
    filter_value: str | None = None
    # drop rows whose (question, answers) repeat an earlier row (BytedTsinghua-SIA/DAPO-Math-17k
    # stores each of its prompts about 100 times)
    dedupe: bool = False

    def describe(self) -> str:
        s = self.path + (f" [{self.config}]" if self.config else "") + f" split={self.split}"
        if self.filter_field:
            s += f" where {self.filter_field}=={self.filter_value!r}"
        return s


@dataclass(frozen=True)
class Sampled:
    """How a validation set is made from the first rows of other benchmarks, as the reference builds
    its ``test_sampled.parquet`` (search: the first 30 rows of each source; math: the first 50 of
    MATH500, then AIME24 and AIME25 whole). ``drmas-bench data prepare --sampled`` writes the file
    (drmas_bench.benchmarks.sampled); the benchmark that declares it reads that file, or the reference's
    own file put in its place, as it comes."""

    # (source benchmark, how many of its first rows (None: all), the data_source the rows carry)
    parts: tuple[tuple[str, int | None, str], ...]
    # one source task -> one row in the reference's layout: row(task, data_source, index in its source)
    row: Callable[[Task, str, int], dict[str, Any]]


@dataclass(frozen=True)
class Benchmark:
    name: str  # registry key, used on the command line
    suite: str  # the `Suite` it belongs to (math | search | toy): the workflow family whose prompts it feeds
    title: str
    expected_rows: int  # the full benchmark's size (REFERENCE.md §3)
    to_task: Callable[[dict[str, Any], int, str], Task]  # (record, row index, benchmark name)
    files: tuple[str, ...] = ()  # candidate paths under the data dir; the first that exists wins
    hub: HubSource | None = None
    # its grading family, a key of drmas_bench.grading.families.FAMILIES (math | qa | toy); "" = its suite's
    family: str = ""
    # files known to hold only part of the benchmark: path -> human note (shown wherever counts are)
    partial_files: dict[str, str] = field(default_factory=dict)
    # for built-in suites that need no files: called with no arguments for an eval (the trainer's
    # `data.source: toy` passes its size, seed and operand range to the toy suite's)
    generate: Callable[..., list[Task]] | None = None
    note: str = ""
    # "test": an evaluation benchmark (its test or dev split), part of its suite's default selection;
    # "train": a training set (a recipe's `data.source: benchmark:NAME`), only ever chosen by name;
    # "val": a validation set made from other benchmarks' rows (`sampled`), only ever chosen by name
    split: str = "test"
    sampled: Sampled | None = None  # how `data prepare --sampled` builds its file (split "val")

    @property
    def kind(self) -> str:
        """How messages name it: "benchmark", "training set" or "validation set"."""
        return {"train": "training set", "val": "validation set"}.get(self.split, "benchmark")


BENCHMARKS: Registry[Benchmark] = Registry("benchmark", filled_by_suites=True)
SPLITS = ("test", "train", "val")


def register(b: Benchmark) -> Benchmark:
    """Register benchmark ``b`` of a registered suite; returns it with its suite's family when it names none."""
    if b.suite not in SUITES:
        raise DeclarationError(f"benchmark {b.name!r}: unknown suite {b.suite!r} (register_suite it first; "
                               f"known: {', '.join(SUITES) or 'none'})")
    if b.split not in SPLITS:
        raise DeclarationError(f"benchmark {b.name!r}: split: unknown split {b.split!r}; known: {', '.join(SPLITS)}")
    if (b.split == "val") != (b.sampled is not None):
        raise DeclarationError(f"benchmark {b.name!r}: sampled: a validation set (split val) is the one that declares it")
    if not b.family:
        b = replace(b, family=SUITES.get(b.suite).family)
    BENCHMARKS.register(b.name, b)
    return b


def first_field(rec: dict[str, Any], *names: str) -> Any:
    for n in names:
        if n in rec and rec[n] is not None:
            return rec[n]
    raise KeyError(f"none of the fields {', '.join(names)}")


def record_id(rec: dict[str, Any], index: int, *names: str) -> str:
    for n in names or ("id", "unique_id", "idx", "_id"):
        if rec.get(n) is not None:
            return str(rec[n])
    return str(index)


def answer_text(value: Any) -> str:
    """A gold answer as text: integral floats (AMC23 stores 27.0) print as integers."""
    if isinstance(value, bool):
        raise ValueError(f"boolean answer {value!r}")
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return value.strip()
    raise ValueError(f"answer of type {type(value).__name__}")
