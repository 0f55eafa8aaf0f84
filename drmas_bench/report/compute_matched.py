"""Compute-matched single-agent baselines: does a team beat one model given the same token budget?

The design (docs/eval.md, "Single-agent baselines"), chosen as the simplest one that is honest:

- budget = tokens per trajectory, prompt + completion over all of its calls (what a server bills and
  what compute grows with), the mean over the run's trajectories; measured, never estimated;
- k = max(1, round(team tokens / single tokens)): the single agent's samples per team sample;
- the single run gets n_team * k samples per question (`drmas_bench.api.evaluate_compute_matched`: a first pass with n_team
  samples measures the single agent's tokens, a second pass in the same run dir adds the rest);
- its score at equal cost: each question's samples, in sample order, are cut into n_team groups of k;
  each group answers by majority vote (math: the grader's extracted answer, else the whole final
  answer; qa: the SQuAD-normalised final answer; ties go to the answer seen first; no answer is a vote
  too) and is right when a trajectory giving the winning answer was graded right; the score is the
  mean over groups and questions, beside the team's avg@n (one team sample = one vote group).

`compute_matched(team, single)` writes ``compute_matched.json`` into the single run dir; the
leaderboard shows it as its own row (`matched_row`) under the single-agent run.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from drmas_bench.grading.qa import normalize_qa
from drmas_bench.metrics import questions
from drmas_bench.records import RecordView, view, views
from drmas_bench.report.runs import load_run
from drmas_bench.types import UserError

FILE = "compute_matched.json"


def tokens_per_trajectory(records: Iterable[Any]) -> float:
    """Mean over trajectories of the prompt + completion tokens of all their calls (unknown counts
    as 0; a run without any count is a UserError: nothing to match)."""
    totals, known = [], 0
    for r in map(view, records):
        tot = 0
        for t in r.turns:
            if t.call.tokens_recorded:
                tot += t.call.tokens
                known += 1
        totals.append(tot)
    if not totals or not known:
        raise UserError("compute-matched: the run records no token counts")
    return float(np.mean(totals))


def matched_k(team_tokens: float, single_tokens: float) -> int:
    """Single-agent samples per team sample at equal tokens: max(1, round(team / single))."""
    return max(1, int(round(team_tokens / max(single_tokens, 1e-9))))


def vote_key(record: Any) -> str | None:
    """What a trajectory's vote is: the grader's extracted answer (math), else the SQuAD-normalised
    final answer (qa, and math without an extraction); None = no answer."""

    r = view(record)
    if r.extracted is not None:
        return r.extracted
    return None if r.final_answer is None else normalize_qa(str(r.final_answer))


def vote(group: list[Any]) -> float:
    """1.0 when the group's majority answer (ties: the first seen) was graded right, else 0.0."""
    counts: dict[Any, int] = {}
    right: dict[Any, bool] = {}
    for r in map(view, group):
        key = vote_key(r)
        counts[key] = counts.get(key, 0) + 1
        right[key] = right.get(key, False) or r.correct
    best = max(counts.values())
    winner = next(k for k in counts if counts[k] == best)  # dicts keep first-seen order
    return 1.0 if right[winner] and winner is not None else 0.0


def matched_values(records: Iterable[Any], k: int, groups: int) -> dict[tuple[str, str], float]:
    """(benchmark, task id) -> mean over its `groups` vote groups of k samples (sample order); a
    question with fewer than k samples has no value (left out)."""
    by_q: dict[tuple[str, str], list[RecordView]] = defaultdict(list)
    for r in views(records):
        by_q[(r.benchmark, r.task_id)].append(r)
    out = {}
    for key, recs in sorted(by_q.items()):
        recs.sort(key=lambda r: r.sample_idx or 0)
        g = min(groups, len(recs) // k)
        if g:
            out[key] = float(np.mean([vote(recs[i * k:(i + 1) * k]) for i in range(g)]))
    return out


def compute_matched(team_dir: str | Path, single_dir: str | Path, write: bool = True) -> dict[str, Any]:
    """The compute-matched comparison of a single-agent run with a team run (module docstring);
    written to ``single_dir/compute_matched.json`` when `write`."""

    team, single = load_run(team_dir), load_run(single_dir)
    if team.suite != single.suite:
        raise UserError(f"compute-matched: {team.path} is a {team.suite} run, {single.path} a {single.suite} run")
    tq, sq = set(questions(team.views)), set(questions(single.views))
    if not tq <= sq:
        raise UserError(f"compute-matched: {len(tq - sq)} of the team run's {len(tq)} questions are not in {single.path} "
                        "(use the same --suite/--benchmarks/--limit as the team run)")
    t_tok, s_tok = tokens_per_trajectory(team.views), tokens_per_trajectory(single.views)
    k = matched_k(t_tok, s_tok)
    values = {q: v for q, v in matched_values(single.views, k, team.n).items() if q in tq}
    team_q = questions(team.views)
    doc = {
        "team_run": str(team.path), "team_workflow": team.workflow, "single_workflow": single.workflow,
        "team_tokens_per_trajectory": t_tok, "single_tokens_per_trajectory": s_tok, "k": k,
        "team_n": team.n, "single_n": single.n, "groups": team.n,
        "questions": len(tq), "questions_with_all_groups": sum(questions(single.views)[q].n >= k * team.n for q in tq),
        "matched": float(np.mean(list(values.values()))) if values else None,
        "team_avg": float(np.mean([team_q[q].c / team_q[q].n for q in tq])) if tq else None,
        "per_question": {f"{b}/{i}": v for (b, i), v in values.items()},
    }
    if write:
        (Path(single.path) / FILE).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return doc


def matched_line(doc: dict[str, Any]) -> str:
    """One line for the console and the leaderboard notes."""
    pct = lambda x: "–" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    return (f"compute-matched to {Path(doc['team_run']).name}: single-agent maj@{doc['k']} {pct(doc['matched'])} vs "
            f"team avg@{doc['team_n']} {pct(doc['team_avg'])} (tokens / trajectory: team "
            f"{doc['team_tokens_per_trajectory']:.0f}, single {doc['single_tokens_per_trajectory']:.0f})")


def read_matched(run_dir: str | Path) -> dict[str, Any] | None:
    p = Path(run_dir) / FILE
    if not p.is_file():
        return None
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
