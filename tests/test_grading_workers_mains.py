"""The grading pool works whatever `__main__` is: a script fed on stdin (`python - <<EOF`), `python -c`,
a script that calls it at import time (no `if __name__ == "__main__":` guard), a notebook-like
`__main__` without `__file__`, a plain thread, and a Ray actor. Every case grades real pairs in real
worker processes; the subprocess cases run a fresh interpreter each."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from drmas_bench.grading import GradingPool, grade_math_many

PAIRS = [("so \\boxed{\\frac{1}{2}}", "0.5"), ("\\boxed{3}", "4"), ("\\boxed{x^2-1}", "(x-1)(x+1)")]
WANT = [(True, "ok"), (False, "ok"), (True, "ok")]

SNIPPET = textwrap.dedent("""
    from drmas_bench.grading.grading_workers import grade_math_many
    res = grade_math_many(%r, timeout_s=20.0, workers=1)
    print("RESULT", [(r.correct, r.status) for r in res])
""") % (PAIRS,)

NOTEBOOK = textwrap.dedent("""
    import sys, types
    cell = %r
    nb_main = types.ModuleType("__main__")   # like a kernel's namespace: no __file__, no __spec__
    sys.modules["__main__"] = nb_main
    exec(compile(cell, "<cell 1>", "exec"), nb_main.__dict__)
""") % (SNIPPET,)


def _python(args: list[str], stdin: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], input=stdin, capture_output=True, text=True, timeout=120,
                          cwd=cwd, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _result(proc: subprocess.CompletedProcess) -> list[tuple[bool, str]]:
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, proc.stdout[-2000:]
    return [tuple(x) for x in eval(line[0][len("RESULT "):])]  # our own repr of a list of tuples


@pytest.mark.parametrize("how", ["stdin", "dash_c", "unguarded_script", "notebook"])
def test_grading_pool_from_any_main(how, tmp_path):
    if how == "stdin":  # `python - <<EOF`: __main__.__file__ is "<stdin>", a file that does not exist
        proc = _python(["-"], stdin=SNIPPET, cwd=tmp_path)
    elif how == "dash_c":
        proc = _python(["-c", SNIPPET], cwd=tmp_path)
    elif how == "unguarded_script":  # workers used to re-run this file (and so call the pool again)
        script = tmp_path / "grade_now.py"
        script.write_text(SNIPPET)
        proc = _python([str(script)], cwd=tmp_path)
    else:
        proc = _python(["-c", NOTEBOOK], cwd=tmp_path)
    assert _result(proc) == WANT


def test_grading_pool_from_a_plain_thread():
    got: dict[str, object] = {}

    def work() -> None:
        with GradingPool(workers=1) as pool:
            got["res"] = [(r.correct, r.status) for r in pool.grade(PAIRS, timeout_s=20.0)]

    t = threading.Thread(target=work)
    t.start()
    t.join(timeout=120)
    assert got["res"] == WANT


def _defined_in_main(extracted: str, gold: str) -> bool:  # pragma: no cover - never runs
    return extracted == gold


def test_a_backend_from_main_is_refused_with_a_reason():
    fn = _defined_in_main
    fn.__module__ = "__main__"  # as if defined in a script: the workers never import __main__
    try:
        with pytest.raises(ValueError, match="importable module"):
            grade_math_many(PAIRS, backend=fn, workers=1)
    finally:
        fn.__module__ = __name__


@pytest.mark.slow
def test_grading_pool_inside_a_ray_actor():
    ray = pytest.importorskip("ray")
    if ray.is_initialized():  # pragma: no cover - another module left one running
        ray.shutdown()
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)  # a new Ray, not a cluster left on this machine
    try:
        @ray.remote(num_cpus=1)
        class Grader:
            def grade(self, pairs):
                from drmas_bench.grading.grading_workers import grade_math_many

                return [(r.correct, r.status) for r in grade_math_many(pairs, timeout_s=20.0, workers=1)]

        actor = Grader.remote()
        assert ray.get(actor.grade.remote(PAIRS), timeout=180) == WANT
    finally:
        ray.shutdown()


def test_a_backend_the_workers_cannot_import_stops_the_batch_with_a_reason(monkeypatch):
    import types

    mod = types.ModuleType("only_in_the_parent")  # importable here, absent in a fresh worker

    def exact(extracted: str, gold: str) -> bool:
        return extracted == gold

    exact.__module__, exact.__qualname__ = mod.__name__, "exact"
    mod.exact = exact
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    with GradingPool(workers=1) as pool:
        with pytest.raises(RuntimeError, match="cannot read its work.*only_in_the_parent"):
            pool.grade(PAIRS, timeout_s=20.0, backend=exact)
