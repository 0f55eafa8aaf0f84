"""Benchmarks: `load_tasks("aime24", data_dir=...)`, `select_benchmarks("math", None)`, ...

Each suite declares its benchmarks in its own folder (``drmas_bench/suites/<suite>/benchmarks.py``);
adding a benchmark is one `register(...)` there. The suites themselves: ``drmas_bench.suites.registry``.
"""

from drmas_bench.benchmarks.catalog import (  # noqa: F401
    BENCHMARKS,
    ENV_DATA_DIR,
    Benchmark,
    HubSource,
    benchmarks_of_suite,
    get_benchmark,
    known_names,
    load_tasks,
    resolve_data_dir,
    select_benchmarks,
)
