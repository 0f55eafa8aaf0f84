"""Benchmarks: `load_tasks("aime24", data_dir=...)`, `select_benchmarks("math", None)`, ...

Each suite declares its benchmarks in its own folder (``drmas_bench/suites/<suite>/benchmarks.py``);
adding a benchmark is one `register(...)` there.
"""

from drmas_bench.tasks.catalog import (  # noqa: F401
    BENCHMARKS,
    ENV_DATA_DIR,
    SUITES,
    Benchmark,
    HubSource,
    Suite,
    benchmarks_of_suite,
    get_benchmark,
    get_suite,
    known_names,
    load_tasks,
    resolve_data_dir,
    select_benchmarks,
    suite_names,
)
