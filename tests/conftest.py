"""Shared fixtures. Benchmark files come from $DRMAS_DATA_DIR or ../shared/data beside the checkout;
tests that need them skip with a reason where neither exists (CI has them)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _shared_folder(env_var: str, name: str) -> Path | None:
    """$env_var if it names a folder, else ../shared/<name> beside the checkout, else None."""
    env = os.environ.get(env_var)
    if env and Path(env).is_dir():
        return Path(env)
    sibling = REPO.parent / "shared" / name
    return sibling if sibling.is_dir() else None


def find_data_dir() -> Path | None:
    return _shared_folder("DRMAS_DATA_DIR", "data")


def find_reference_vectors() -> Path | None:
    """The reference's own outputs (../shared/reference_vectors, or $DRMAS_REFERENCE_VECTORS)."""
    return _shared_folder("DRMAS_REFERENCE_VECTORS", "reference_vectors")


def load_reference_cases(filename: str, rule_prefix: str = "") -> list[dict]:
    """Every case of one reference-vector file whose rule starts with `rule_prefix`; skips the
    calling test with a reason where the folder is absent (CI has it)."""
    import json

    d = find_reference_vectors()
    if d is None:
        pytest.skip("reference vectors not found: set DRMAS_REFERENCE_VECTORS or place "
                    "shared/reference_vectors beside the repo")
    with open(d / filename, encoding="utf-8") as f:
        cases = [json.loads(line) for line in f if line.strip()]
    return [c for c in cases if c["rule"].startswith(rule_prefix)]


def busy_factor() -> float:
    """How many times over its usable cores this machine is loaded now (1-minute load average over
    usable CPUs), at least 1. A wall-clock bound that holds on an idle machine is multiplied by it,
    so that a busy shared machine (load 20 on 2 cores stretches a worker restart from 0.5 s to 5 s)
    stretches the bound instead of failing the test; on an idle machine (CI) the bound is unchanged.
    A bound on the test's own computation is better taken in CPU seconds (time.process_time).

    CI's training recipes run beside the tests at nice 19 (.ci/run), where they take only idle CPU
    but still count in the load average: $DRMAS_CI_BACKGROUND names a file of their process ids, and
    each one still running is left out of the load."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:
        return 1.0
    return max(1.0, (load - _background_running()) / max(cpus, 1))


def _background_running() -> int:
    """How many of the processes listed in $DRMAS_CI_BACKGROUND (one id a line) are still running."""
    listed = os.environ.get("DRMAS_CI_BACKGROUND")
    if not listed:
        return 0
    try:
        pids = [int(x) for x in Path(listed).read_text().split()]
    except (OSError, ValueError):
        return 0
    return sum(Path(f"/proc/{pid}").exists() for pid in pids)


# rule -> {family: (cases, agreeing)}: every reference-vector case a test checked in this session,
# printed as a table at the end and compared with the folder's rules (pytest_sessionfinish)
PARITY: dict[str, dict[str, tuple[int, int]]] = {}


def assert_all_agree(family: str, cases: list[dict], check) -> None:
    """Run `check(case) -> (ok, got)` on every case; fail with the count and the first few
    disagreements (input, reference, ours) unless all agree. An empty family fails too."""
    assert cases, f"{family}: no cases found"
    bad = []
    for c in cases:
        ok, got = check(c)
        if not ok:
            bad.append((c, got))
    for rule in {c["rule"] for c in cases}:
        n = sum(c["rule"] == rule for c in cases)
        PARITY.setdefault(rule, {})[family] = (n, n - sum(c["rule"] == rule for c, _ in bad))
    shown = "\n".join(f"  input={c['input']!r}\n    reference={c['reference']!r}\n    ours={g!r}" for c, g in bad[:5])
    assert not bad, f"{family}: {len(cases) - len(bad)}/{len(cases)} agree; first disagreements:\n{shown}"


def _vector_rules() -> dict[str, int]:
    """rule -> number of cases, over every file of the reference-vector folder."""
    import json

    d = find_reference_vectors()
    rules: dict[str, int] = {}
    for f in sorted(d.glob("*.jsonl")) if d else []:
        with open(f, encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    rule = json.loads(line)["rule"]
                    rules[rule] = rules.get(rule, 0) + 1
    return rules


def pytest_terminal_summary(terminalreporter):
    _report_time_limit(terminalreporter)
    if PARITY:
        terminalreporter.section("parity with the reference's own outputs (cases agreeing / cases)")
        for rule in sorted(PARITY):
            for family, (n, ok) in sorted(PARITY[rule].items()):
                terminalreporter.write_line(f"{rule:28s} {family:34s} {ok:6d} / {n:<6d}")


def pytest_sessionfinish(session, exitstatus):
    """A whole-suite run (no paths, -k or -m) must have checked every rule of the folder: a family
    that no test reads any more fails the session instead of passing unseen. Under
    DRMAS_TEST_LIMIT_S a test over the limit fails the session too."""
    limit = _time_limit_s()
    if limit is not None and _over_limit(limit) and session.exitstatus == 0:
        session.exitstatus = 1
    opt = session.config.option
    if session.config.args != [str(REPO / "tests")] and session.config.args not in ([], ["tests"]):
        return
    if (getattr(opt, "keyword", "") or getattr(opt, "markexpr", "") or getattr(opt, "collectonly", False)
            or find_reference_vectors() is None):
        return
    unchecked = sorted(set(_vector_rules()) - set(PARITY))
    if unchecked and exitstatus == 0:
        session.config.get_terminal_writer().line(
            f"reference-vector rules no test checked: {', '.join(unchecked)}", red=True)
        session.exitstatus = 1


@pytest.fixture(scope="session")
def data_dir() -> Path:
    d = find_data_dir()
    if d is None:
        pytest.skip("benchmark data not found: set DRMAS_DATA_DIR or place shared/data beside the repo")
    return d


def pytest_configure(config):
    config.pluginmanager.register(_TestTimer(), "drmas-test-timer")
    config.addinivalue_line("markers", "gpu_smoke: a scripts/gpu_smoke.sh step; also runs on CPU at tiny sizes "
                                       "when GPU_SMOKE_CPU=1 (the dry run)")


def pytest_collection_modifyitems(config, items):
    _deselect_slow(config, items)
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except Exception:
        has_gpu = False
    if not has_gpu:
        dry_run = os.environ.get("GPU_SMOKE_CPU") == "1"  # the smoke steps' CPU dry run (tests/test_gpu_smoke.py)
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if "gpu" in item.keywords and not (dry_run and "gpu_smoke" in item.keywords):
                item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _cli_logging():
    """Messages reach stderr as under the CLI (INFO, bare text), also for tests that call a command
    function directly; the handler writes to the sys.stderr of the moment, so capsys sees them."""
    from drmas_bench import log

    log.setup()


# --- the two tiers and the fast tier's time limit ---------------------------------------------------
#
# `python -m pytest -q` is the fast tier: tests marked `slow` are deselected unless the run names a
# marker expression (`-m slow`: the end-to-end tier; `-m "slow or not slow"`: everything) or picks
# tests by node id (`pytest tests/test_x.py::test_y` runs that test whatever its mark).
#
# DRMAS_TEST_LIMIT_S=10 (what .ci/run sets for the fast tier) fails the session when a test's wall
# time is over the limit, naming each one. A test's time is its call phase plus its setup phase less
# the session-scoped fixtures set up for it (those are built once for many tests; they are listed
# separately with their seconds so their cost stays visible). DRMAS_TEST_TIMES=FILE appends each
# test's wall seconds, its CPU seconds and its node id to FILE as it finishes. The CPU figure is
# user + sys of the pytest process and of the child processes it waited for during the test (setup,
# call and teardown): a Ray worker or a server the test did not wait for is not in it.

import resource as _resource
import time as _time

_SESSION_FIXTURE_S: dict[str, float] = {}  # session-scoped fixture -> seconds of its one set-up
_ITEM_SHARED_S: dict[str, float] = {}  # nodeid -> seconds of session fixtures set up in its setup
_ITEM_S: dict[str, float] = {}  # nodeid -> setup (less session fixtures) + call seconds
_CURRENT: list[str] = []  # nodeid of the test being set up
_CPU_AT_START: dict[str, float] = {}  # nodeid -> CPU seconds (self + waited children) when its setup began


def _cpu_s() -> float:
    own, kids = _resource.getrusage(_resource.RUSAGE_SELF), _resource.getrusage(_resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _time_limit_s() -> float | None:
    v = os.environ.get("DRMAS_TEST_LIMIT_S", "").strip()
    return float(v) if v else None


def _picks_by_node_id(config) -> bool:
    return any("::" in str(a) for a in config.args)


def _deselect_slow(config, items) -> None:
    if getattr(config.option, "markexpr", "") or _picks_by_node_id(config):
        return
    keep, slow = [], []
    for item in items:
        (slow if "slow" in item.keywords else keep).append(item)
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = keep


class _TestTimer:
    """Registered as a plugin (pytest_configure), not as conftest hooks: a session-scoped fixture is
    set up through the session node's hooks, which a conftest below the rootdir does not receive."""

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item):
        _CURRENT[:] = [item.nodeid]
        _CPU_AT_START[item.nodeid] = _cpu_s()
        yield
        _CURRENT.clear()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        t0 = _time.perf_counter()
        yield
        if fixturedef.scope == "session" and _CURRENT:
            dt = _time.perf_counter() - t0
            _SESSION_FIXTURE_S[fixturedef.argname] = _SESSION_FIXTURE_S.get(fixturedef.argname, 0.0) + dt
            _ITEM_SHARED_S[_CURRENT[0]] = _ITEM_SHARED_S.get(_CURRENT[0], 0.0) + dt

    def pytest_runtest_logreport(self, report):
        if report.when in ("setup", "call"):
            d = report.duration - (_ITEM_SHARED_S.get(report.nodeid, 0.0) if report.when == "setup" else 0.0)
            _ITEM_S[report.nodeid] = _ITEM_S.get(report.nodeid, 0.0) + max(d, 0.0)
        if report.when == "teardown" and os.environ.get("DRMAS_TEST_TIMES"):
            # one line per finished test, written as it finishes (readable while a long run goes on)
            cpu = _cpu_s() - _CPU_AT_START.pop(report.nodeid, _cpu_s())
            with open(os.environ["DRMAS_TEST_TIMES"], "a", encoding="utf-8") as f:
                f.write(f"{_ITEM_S.get(report.nodeid, 0.0):8.2f} {cpu:8.2f} {report.nodeid}\n")


def _over_limit(limit: float) -> list[tuple[str, float]]:
    return sorted(((n, s) for n, s in _ITEM_S.items() if s > limit), key=lambda x: -x[1])


def _report_time_limit(terminalreporter) -> None:
    limit = _time_limit_s()
    if limit is None:
        return
    over = _over_limit(limit)
    terminalreporter.section(f"fast-tier time limit: {limit:g} s per test (DRMAS_TEST_LIMIT_S)")
    for name, s in sorted(_SESSION_FIXTURE_S.items(), key=lambda x: -x[1]):
        terminalreporter.write_line(f"session fixture {name}: {s:.1f} s (once)")
    for nodeid, s in over:
        terminalreporter.write_line(f"OVER {s:6.1f} s  {nodeid}", red=True)
    if over:
        terminalreporter.write_line(f"{len(over)} test(s) over {limit:g} s: the session fails (mark them slow "
                                    "or make them cheaper)", red=True)
    else:
        terminalreporter.write_line(f"every test took at most {limit:g} s", green=True)
