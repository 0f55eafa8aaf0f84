"""Retriever evaluation against questions with supporting passages and gold answers.

Questions file: JSON lines with ``question``, gold answers in ``golden_answers`` (or ``answers`` /
``answer``), and optionally ``supporting_passage_ids`` (corpus ids), ``id``, ``dataset``, ``split``
(the shape of ``covered_questions.jsonl``).

Metrics, for each k (macro over questions, per dataset and overall):

* ``all@k``  every supporting passage is in the top k (the multi-hop notion of recall);
* ``any@k``  at least one supporting passage is in the top k;
* ``ans@k``  a gold answer string appears in a top-k passage (title + text), after SQuAD
  normalisation (``text.normalize_squad``, the grading's: lower case, punctuation removed, no
  articles, single spaces) and on word boundaries;
* ``mrr``    mean reciprocal rank of the first supporting passage within the largest k (0 if absent).

Passage metrics count only questions that list supporting passages; answer recall counts all.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from drmas_retrieval.base import Hit, RetrievalError, Retriever
from drmas_retrieval.text import normalize_squad

normalize_answer = normalize_squad  # the one SQuAD normalisation (the QA grading's too)


def contains_answer(normalized_text: str, answers: Iterable[str]) -> bool:
    """Whether any (already normalised) answer occurs in the normalised text on word boundaries."""
    padded = f" {normalized_text} "
    return any(a and f" {a} " in padded for a in answers)


@dataclass
class EvalQuestion:
    """One evaluation question."""

    id: str
    question: str
    answers: list[str]
    supporting: list[str] = field(default_factory=list)
    group: str = "all"


def read_questions(path: str | os.PathLike[str], limit: int | None = None) -> list[EvalQuestion]:
    """Read a questions jsonl. Options: ``limit`` = first N questions. Errors name ``file:line``."""
    p = Path(path)
    if not p.is_file():
        raise RetrievalError(f"questions file not found: {p}")
    out: list[EvalQuestion] = []
    with open(p, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if limit is not None and len(out) >= limit:
                break
            if not line.strip():
                continue
            where = f"{p}:{lineno}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise RetrievalError(f"{where}: not valid JSON ({e.msg})") from None
            if not isinstance(rec, dict) or not isinstance(rec.get("question"), str) or not rec["question"].strip():
                raise RetrievalError(f"{where}: needs a non-empty 'question' string")
            golds = next((rec[k] for k in ("golden_answers", "answers", "answer") if k in rec), [])
            golds = [golds] if isinstance(golds, str) else list(golds or [])
            sup = rec.get("supporting_passage_ids") or []
            if not isinstance(sup, list):
                raise RetrievalError(f"{where}: 'supporting_passage_ids' must be a list")
            if not golds and not sup:
                raise RetrievalError(f"{where}: needs gold answers or 'supporting_passage_ids'")
            group = "/".join(str(rec[k]) for k in ("dataset", "split") if rec.get(k)) or "all"
            out.append(EvalQuestion(str(rec.get("id", lineno)), rec["question"], [str(g) for g in golds],
                                    [str(s) for s in sup], group))
    if not out:
        raise RetrievalError(f"{p}: no questions")
    return out


@dataclass
class _Acc:
    n: int = 0
    n_sup: int = 0
    all_k: dict[int, int] = field(default_factory=dict)
    any_k: dict[int, int] = field(default_factory=dict)
    ans_k: dict[int, int] = field(default_factory=dict)
    rr: float = 0.0

    def row(self, ks: list[int]) -> dict[str, Any]:
        d: dict[str, Any] = {"n": self.n, "n_with_support": self.n_sup}
        sup = max(self.n_sup, 1)
        for k in ks:
            d[f"all@{k}"] = self.all_k.get(k, 0) / sup if self.n_sup else None
        for k in ks:
            d[f"any@{k}"] = self.any_k.get(k, 0) / sup if self.n_sup else None
        d["mrr"] = self.rr / sup if self.n_sup else None
        for k in ks:
            d[f"ans@{k}"] = self.ans_k.get(k, 0) / max(self.n, 1)
        return d


def score_question(q: EvalQuestion, hits: list[Hit], ks: list[int], norm_cache: dict[str, str]) -> dict[str, Any]:
    """Per-question outcomes: ``all`` / ``any`` / ``ans`` dicts k -> bool and ``rr`` (float or None)."""
    ids = [h.id for h in hits]
    answers = [a for a in (normalize_answer(x) for x in q.answers) if a]
    first_ans = None
    for i, h in enumerate(hits):
        key = h.id or h.contents
        if key not in norm_cache:
            norm_cache[key] = normalize_answer(h.title + " " + h.text)
        if contains_answer(norm_cache[key], answers):
            first_ans = i
            break
    res: dict[str, Any] = {"ans": {k: first_ans is not None and first_ans < k for k in ks}, "rr": None}
    if q.supporting:
        sup = set(q.supporting)
        res["all"] = {k: sup <= set(ids[:k]) for k in ks}
        res["any"] = {k: bool(sup & set(ids[:k])) for k in ks}
        rank = next((i for i, x in enumerate(ids[:max(ks)]) if x in sup), None)
        res["rr"] = 0.0 if rank is None else 1.0 / (rank + 1)
    return res


def evaluate(retriever: Retriever, questions: list[EvalQuestion], ks: Iterable[int] = (1, 3, 5, 10),
             batch_size: int = 64, progress: bool = True) -> dict[str, Any]:
    """Run every question through ``retriever`` (top max(ks)) and compute the metrics.

    Options: ``ks`` cut-offs, ``batch_size`` queries per ``search`` call, ``progress`` bar.
    Returns ``{"ks", "n", "search_s", "queries_per_s", "groups": {group: row}, "overall": row}``
    where a row maps ``n``, ``n_with_support``, ``all@k``, ``any@k``, ``mrr``, ``ans@k`` to values."""
    from tqdm import tqdm

    ks = sorted(set(int(k) for k in ks))
    if not ks or ks[0] < 1:
        raise RetrievalError(f"k values must be positive integers, got {ks}")
    kmax = ks[-1]
    accs: dict[str, _Acc] = {}
    overall = _Acc()
    cache: dict[str, str] = {}
    t_search = 0.0
    bar = tqdm(total=len(questions), desc="eval", unit="q", disable=not progress)
    for a in range(0, len(questions), batch_size):
        batch = questions[a:a + batch_size]
        t0 = time.perf_counter()
        hits = retriever.search([q.question for q in batch], kmax)
        t_search += time.perf_counter() - t0
        for q, h in zip(batch, hits):
            r = score_question(q, h, ks, cache)
            for acc in (accs.setdefault(q.group, _Acc()), overall):
                acc.n += 1
                for k in ks:
                    acc.ans_k[k] = acc.ans_k.get(k, 0) + r["ans"][k]
                if r["rr"] is not None:
                    acc.n_sup += 1
                    acc.rr += r["rr"]
                    for k in ks:
                        acc.all_k[k] = acc.all_k.get(k, 0) + r["all"][k]
                        acc.any_k[k] = acc.any_k.get(k, 0) + r["any"][k]
        bar.update(len(batch))
    bar.close()
    return {
        "ks": ks,
        "n": overall.n,
        "search_s": round(t_search, 3),
        "queries_per_s": round(overall.n / t_search, 2) if t_search > 0 else None,
        "groups": {g: accs[g].row(ks) for g in sorted(accs)},
        "overall": overall.row(ks),
    }


def format_report(result: dict[str, Any], title: str = "") -> str:
    """A markdown table (tabulate): one row per group and an ``all`` row; metrics in percent."""
    from tabulate import tabulate

    ks = result["ks"]
    cols = ["n"] + [f"all@{k}" for k in ks] + [f"any@{k}" for k in ks] + ["mrr"] + [f"ans@{k}" for k in ks]
    rows = list(result["groups"].items())
    if len(rows) != 1 or rows[0][0] != "all":
        rows.append(("all", result["overall"]))

    def cell(c: str, v: Any) -> Any:
        if v is None:
            return "-"
        return v if c == "n" else (f"{v:.3f}" if c == "mrr" else f"{100 * v:.1f}")

    table = [[g] + [cell(c, r[c]) for c in cols] for g, r in rows]
    head = f"{title}\n" if title else ""
    foot = (f"\nall@k: every supporting passage in the top k; any@k: at least one; mrr: first supporting passage "
            f"(within top {ks[-1]}); ans@k: a gold answer string in a top-k passage. Percent of questions. "
            f"{result['n']} questions, {result['queries_per_s']} queries/s.")
    return head + tabulate(table, headers=["group"] + cols, tablefmt="github") + foot
