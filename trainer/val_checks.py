"""The ``val:`` settings whose meaning is known before training starts, checked then:
``drmas_trainer.trainer.train`` calls :func:`check_val` before the run folder exists, so a wrong
``keep_best`` or benchmark is one line, not a warm start, a step-0 checkpoint and a validation later.

- the benchmarks are graded by the team's family (a toy team validating on math500 scores 0 %);
- ``keep_best`` needs validation to happen, and must be a name validation logs
  (``drmas_trainer.validation.val_metrics``): ``avg@n`` with the recipe's ``val.n``, ``pass@k`` with
  k <= n, over all questions (``val/``), a benchmark (``val/<bench>/``), a sampled set's data
  source, ``val/macro/``, or an agent's ``val/agent/<a>/valid/mean`` / ``num_calls/mean``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from drmas_bench.benchmarks.catalog import get_benchmark
from drmas_bench.types import UserError

if TYPE_CHECKING:
    from drmas_bench.workflows.base import WorkflowSpec
    from drmas_trainer.config.train import TrainConfig

PREFIX = "val/"
COUNTS = ("calls", "questions", "samples")  # logged, but no score: refused as keep_best with the reason


def check_val(cfg: "TrainConfig", wf: "WorkflowSpec") -> None:
    """Refuse, in one line, a ``val:`` section that validation would refuse or ignore later."""
    v = cfg.val
    for name in (v.benchmarks or []) if v.active else []:  # validation off: its benchmarks are never run
        b = get_benchmark(name)
        if b.family != wf.family:
            raise UserError(f"val.benchmarks: {name} is graded as {b.family} (the {b.suite} suite); the team's "
                            f"workflow {wf.name} answers {wf.family} questions: validate on a {wf.family} benchmark")
    if v.keep_best is None:
        return
    if not v.active:
        raise UserError(f"val.keep_best {v.keep_best!r}: validation is off (val.every 0, val.before_train false), so "
                        f"no checkpoint would ever be kept as the best; set val.every or drop val.keep_best")
    check_keep_best(v.keep_best, v.n, v.benchmarks or [], wf.agents)


def check_keep_best(metric: str, n: int, benchmarks: list[str], agents: tuple[str, ...]) -> None:
    """``metric`` is a score validation logs with ``n`` samples per question (module docstring)."""
    parts = metric.removeprefix(PREFIX).split("/")
    head = f"val.keep_best {metric!r}"
    if parts[0] == "agent":
        if len(parts) != 4 or parts[2:] not in (["valid", "mean"], ["num_calls", "mean"]):
            raise UserError(f"{head}: an agent's validation names are val/agent/<agent>/valid/mean and "
                            f".../num_calls/mean")
        if parts[1] not in agents:
            raise UserError(f"{head}: no agent {parts[1]!r} in the team; its agents: {', '.join(agents)}")
        return
    *path, leaf = parts
    if not path and leaf in COUNTS:
        raise UserError(f"{head} counts work, not a score: name a score such as val/avg@{n}")
    m = re.fullmatch(r"(avg|pass)@(\d+)", leaf)
    if m is None and leaf != "test_score":
        raise UserError(f"{head}: no validation logs it; a score is val/[<benchmark>/]avg@{n} or pass@k (k <= {n}), "
                        f"or val/<benchmark>/test_score")
    if m is not None:
        k = int(m.group(2))
        if m.group(1) == "avg" and k != n:
            raise UserError(f"{head}: validation samples val.n {n} per question and logs avg@{n}, not avg@{k}; "
                            f"set val.keep_best={PREFIX}{'/'.join([*path, f'avg@{n}'])} or val.n {k}")
        if m.group(1) == "pass" and not 1 <= k <= n:
            raise UserError(f"{head}: with val.n {n} validation logs pass@1 .. pass@{n}")
    where = "/".join(path)
    sources = {s for b in benchmarks if (bm := get_benchmark(b)).sampled for _, _, s in bm.sampled.parts}
    # a benchmark read from files (not generated, not a sampled set) may name any data source in its rows
    unsampled = any((bm := get_benchmark(b)).sampled is None and bm.generate is None for b in benchmarks)
    known = {"", "macro", *benchmarks, *sources}
    if where not in known and not unsampled:
        raise UserError(f"{head}: {where!r} is none of the validated benchmarks or their data sources: "
                        f"{', '.join(sorted(known - {''}))}")
    if where == "" and leaf == "test_score":
        raise UserError(f"{head}: test_score is logged per benchmark or data source: val/<benchmark>/test_score")
