"""Per-agent effects in run summaries (metrics.effects): each formula checked against a plain
reference implementation written here on random runs recorded by the real workflows (scripted
texts, graded by the run's grading entry point), plus records older than the figures."""

from __future__ import annotations

import asyncio
import json
import random
import re
import string
from collections import Counter

import numpy as np
import pytest

from drmas_bench.metrics import effects, summarize
from drmas_bench.suites.math.math_refine import FLIPS, math_effects, round1_answer
from drmas_bench.suites.search.search_route import search_effects
from drmas_bench.pricing import ModelPrice, PriceSheet
from drmas_bench.report.markdown import format_summary_markdown
from drmas_bench.runner import grade_trajectories
from drmas_bench.types import Completion, Sampling, Task
from drmas_bench.workflows.base import Episode

# ------------------------------------------------------------------ random recorded runs (the real workflows)


class ScriptedBackend:
    """Answers each agent from its own list of texts, at random, with random latencies and usage."""

    def __init__(self, rng: random.Random, texts: dict[str, list[str]]) -> None:
        self.rng, self.texts = rng, texts

    def worker_group(self, agent: str) -> str:
        return "big" if agent == "solver" else "small"

    def sampling(self, agent: str) -> Sampling:
        return Sampling(max_new_tokens=8)

    async def generate(self, agent: str, request) -> Completion:
        r = self.rng
        return Completion(r.choice(self.texts[agent]), prompt_tokens=r.randint(1, 500), completion_tokens=r.randint(1, 90),
                          latency_s=r.random() * 3, finish="stop")


MATH_TEXTS = {
    "solver": ["so \\boxed{5}", "so \\boxed{7}", "\\boxed{5.0}", "no box 5", "\\boxed{7} then \\boxed{5}", "\\boxed{3}"],
    "verifier": ["<verify>approve</verify>", "<verify>reject</verify>", "<verify> reject </verify>", "hmm", "<verify>reject"],
}


def random_math_run(seed: int, episodes: int = 24, rounds: int = 2) -> list[dict]:
    """Episodes of the real math_refine workflow, graded as a run grades them."""
    from drmas_bench.suites.math.math_refine import math_refine

    rng = random.Random(seed)
    trajs = []
    for i in range(episodes):
        task = Task(id=f"q{i // 3}", benchmark=rng.choice(["aime24", "math500"]), question="What is 2+3?", answers=["5"])
        ep = Episode(task, i % 3, ScriptedBackend(rng, MATH_TEXTS), ("solver", "verifier"))
        asyncio.run(math_refine(ep, rounds=rounds))
        trajs.append(ep.finish())
    grade_trajectories(trajs, "math", round1_answer=round1_answer)
    return [json.loads(json.dumps(t.to_dict())) for t in trajs]


SEARCH_TEXTS = {
    "verifier": ["<verify>no</verify>", "<verify>yes</verify>", "<verify>no</verify>", "<VERIFY>no</VERIFY>", "???"],
    "searcher": ["<think>a</think><search>capital of France</search>", "<think>a</think><search>rome</search>",
                 "<think>a</think>nothing"],
    "answerer": ["<think>a</think><answer>Paris</answer>", "<think>a</think><answer>Rome</answer>", "<think>a</think>",
                 "<answer>Paris</answer>"],
}
PASSAGES = ["The city of Paris, France.", "Rome is in Italy.", "parisian cafes", "PARIS!", "Nothing here.",
            "the capital is paris"]


class RandomRetriever:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def search(self, queries, k):
        return [[{"title": "T", "text": self.rng.choice(PASSAGES)} for _ in range(k)] for _ in queries]


def random_search_run(seed: int, episodes: int = 30) -> list[dict]:
    """Episodes of the real search_route workflow with scripted responses, graded as a run grades them."""
    from drmas_bench.suites.search.search_route import search_route

    rng = random.Random(seed)
    trajs = []
    for i in range(episodes):
        task = Task(id=f"q{i // 2}", benchmark=rng.choice(["hotpotqa", "nq"]), question="Capital of France?",
                    answers=rng.choice([["Paris"], ["the Paris"], ["Lyon", "Paris"], ["Rome"]]))
        ep = Episode(task, i % 2, ScriptedBackend(rng, SEARCH_TEXTS), ("verifier", "searcher", "answerer"),
                     retriever=RandomRetriever(rng))
        asyncio.run(search_route(ep))
        trajs.append(ep.finish())
    grade_trajectories(trajs, "qa")
    return [json.loads(json.dumps(t.to_dict())) for t in trajs]


# ------------------------------------------------------------------ plain reference implementations


def plain_boxed(text: str) -> str | None:
    m = re.findall(r"\\boxed\{([^{}]*)\}", text)
    return m[-1] if m else None


def plain_math_right(text: str) -> bool:
    """The scripted solver texts' truth: the last boxed answer is 5 or 5.0."""
    return plain_boxed(text) in ("5", "5.0")


def plain_math(recs: list[dict]) -> dict:
    flips, judged, graded, ran = Counter(), [], [], 0
    for r in recs:
        sol = [t["completion"]["text"] for t in r["turns"] if t["agent"] == "solver"]
        ver = [t["completion"]["text"] for t in r["turns"] if t["agent"] == "verifier"]
        first, last = plain_math_right(sol[0]), plain_math_right(sol[-1])
        graded.append((first, last))
        if len(sol) > 1:
            ran += 1
            flips[("right" if first else "wrong") + "_to_" + ("right" if last else "wrong")] += 1
        if ver:
            approve = "<verify>reject</verify>" not in ver[0].replace("<verify> reject </verify>", "<verify>reject</verify>")
            judged.append((first, approve))
    def rate(xs):
        return sum(xs) / len(xs) if xs else None
    return {"ran": ran, "flips": flips, "judged": len(judged),
            "on_right": rate([a for f, a in judged if f]), "on_wrong": rate([a for f, a in judged if not f]),
            "precision": rate([f for f, a in judged if a]),
            "judge_acc": rate([f == a for f, a in judged]),
            "r1": rate([f for f, _ in graded]), "final": rate([l for _, l in graded])}


def squad_tokens(text: str) -> list[str]:
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return [w for w in text.split() if w not in ("a", "an", "the")]


def contains(passages: str, gold: str) -> bool:
    p, g = squad_tokens(passages), squad_tokens(gold)
    return bool(g) and any(p[i:i + len(g)] == g for i in range(len(p) - len(g) + 1))


def plain_passages(obs: str) -> str:
    """The documents' text inside ``<information>{"result": ...}</information>`` (REFERENCE 2b)."""
    return json.loads(obs.removeprefix("<information>").removesuffix("</information>"))["result"] if obs else ""


def plain_search(recs: list[dict]) -> dict:
    at, anywhere = [], []
    for r in recs:
        obs = [plain_passages(s["observation"]) for s in r["extra"]["env"]["steps"]]
        golds = r["task"]["answers"]
        anywhere.append(any(contains("\n".join(obs), g) for g in golds))
        step, found = 0, None
        for t in r["turns"]:
            if t["agent"] == "verifier":
                step += 1
            elif t["agent"] == "answerer":
                found = any(contains("\n".join(obs[:step - 1]), g) for g in golds)
        if found is not None:
            at.append((found, r["correct"]))
    def rate(xs):
        return sum(xs) / len(xs) if xs else None
    return {"answerer": len(at), "recall": rate([e for e, _ in at]),
            "acc_with": rate([c for e, c in at if e]), "acc_without": rate([c for e, c in at if not e]),
            "anywhere": rate(anywhere)}


# ------------------------------------------------------------------ tests


@pytest.mark.parametrize("seed", range(4))
def test_math_effects_match_the_plain_implementation(seed):
    recs = random_math_run(seed)
    got, want = math_effects(recs), plain_math(recs)
    assert got["episodes"] == len(recs)
    assert got["round2_ran"] == want["ran"] and got["round2_rate"] == pytest.approx(want["ran"] / len(recs))
    assert got["flips"] == {k: want["flips"][k] for k in FLIPS}
    assert got["round1_ungraded"] == 0
    assert got["judged"] == want["judged"]
    for key, plain in [("approve_rate_on_right", "on_right"), ("approve_rate_on_wrong", "on_wrong"),
                       ("judge_precision", "precision"), ("judge_recall", "on_right"), ("judge_accuracy", "judge_acc"),
                       ("round1_accuracy", "r1"), ("final_accuracy", "final")]:
        assert got[key] == pytest.approx(want[plain]), key
    assert got["accuracy_change"] == pytest.approx(
        (got["flips"]["wrong_to_right"] - got["flips"]["right_to_wrong"]) / len(recs))


def test_round1_answers_are_graded_once_at_grading_time():
    """The run's grader grades the first answer only where a later round replaced it."""
    recs = random_math_run(11, episodes=30)
    for r in recs:
        sol = [t["completion"]["text"] for t in r["turns"] if t["agent"] == "solver"]
        assert r["correct"] == plain_math_right(sol[-1])
        if len(sol) > 1:
            assert r["extra"]["round1_correct"] == plain_math_right(sol[0])
            assert r["extra"]["round1_grade"] == "ok"
        else:
            assert "round1_correct" not in r["extra"]
    assert any("round1_correct" in r["extra"] for r in recs) and any("round1_correct" not in r["extra"] for r in recs)


def test_a_single_round_run_has_no_verifier_effect():
    recs = random_math_run(5, episodes=6, rounds=1)
    m = math_effects(recs)
    assert (m["round2_ran"], m["judged"], m["approve_rate_on_right"]) == (0, 0, None)
    assert m["round1_accuracy"] == m["final_accuracy"] and m["accuracy_change"] == 0


@pytest.mark.parametrize("seed", range(4))
def test_search_effects_match_the_plain_implementation(seed):
    recs = random_search_run(seed)
    got, want = search_effects(recs), plain_search(recs)
    assert got["episodes"] == got["env_recorded"] == len(recs)
    assert got["answerer_episodes"] == want["answerer"]
    assert got["with_evidence"] + got["without_evidence"] == want["answerer"]
    for key, plain in [("evidence_recall", "recall"), ("accuracy_with_evidence", "acc_with"),
                       ("accuracy_without_evidence", "acc_without"), ("evidence_retrieved_rate", "anywhere")]:
        assert got[key] == pytest.approx(want[plain]), key
    searches = [sum(s["query"] is not None for s in r["extra"]["env"]["steps"]) for r in recs]
    assert got["searches_per_episode"] == pytest.approx(np.mean(searches))
    assert got["searches_distribution"] == {str(k): v for k, v in sorted(Counter(searches).items())}
    assert got["steps_per_episode"] == pytest.approx(np.mean([len(r["extra"]["env"]["steps"]) for r in recs]))
    assert got["no_answer_rate"] == pytest.approx(np.mean([r["final_answer"] is None for r in recs]))


def test_the_random_search_runs_cover_every_case():
    """The recorded runs above exercise evidence present and absent, right and wrong, no answerer."""
    recs = [r for s in range(4) for r in random_search_run(s)]
    got = search_effects(recs)
    assert got["with_evidence"] and got["without_evidence"] and got["answerer_episodes"] < len(recs)
    assert 0 < got["accuracy_with_evidence"] < 1 and 0 <= got["accuracy_without_evidence"] < 1


@pytest.mark.parametrize("make", [random_math_run, random_search_run])
def test_per_agent_latency_tokens_and_dollars(make):
    recs = make(3)
    prices = PriceSheet({"big": ModelPrice(input_per_1m=1.0, output_per_1m=2.0), "small": ModelPrice(gpu_hour=3.6)})
    s = summarize(recs, prices=prices, n_boot=10)
    n_q = len({(r["task"]["benchmark"], r["task"]["id"]) for r in recs})
    assert s["effects"]["agents"].keys() == {t["agent"] for r in recs for t in r["turns"]}
    for name, a in s["effects"]["agents"].items():
        turns = [t for r in recs for t in r["turns"] if t["agent"] == name]
        lat = [t["completion"]["latency_s"] for t in turns]
        assert a["latency_s"]["p50"] == pytest.approx(np.percentile(lat, 50))
        assert a["latency_s"]["p95"] == pytest.approx(np.percentile(lat, 95))
        assert a["calls"] == len(turns) and a["calls_per_question"] == pytest.approx(len(turns) / n_q)
        toks = sum(t["completion"]["prompt_tokens"] + t["completion"]["completion_tokens"] for t in turns)
        assert a["tokens_per_question"] == pytest.approx(toks / n_q)
        usd = sum(t["completion"]["prompt_tokens"] * 1e-6 + t["completion"]["completion_tokens"] * 2e-6
                  if t["wg"] == "big" else t["completion"]["latency_s"] / 1000 for t in turns)
        assert a["usd_per_call"] == pytest.approx(usd / len(turns))
        assert a["usd_per_question"] == pytest.approx(usd / n_q)
        assert a == {k: v for k, v in s["micro"]["agents"][name].items() if k in a}  # one definition


def test_effects_per_benchmark_add_up():
    recs = random_math_run(8, episodes=30)
    eff = effects(recs, "math_refine")
    per = eff["benchmarks"]
    assert set(per) == {r["task"]["benchmark"] for r in recs}
    for k in FLIPS:
        assert sum(b["math"]["flips"][k] for b in per.values()) == eff["math"]["flips"][k]
    assert sum(b["math"]["episodes"] for b in per.values()) == len(recs)


def _md_rows(md: str, heading: str) -> dict[str, list[str]]:
    """The rows of the Markdown table under ``heading``: first cell -> the other cells."""
    section = md.split(heading)[1].split("\n### ")[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| ") and "---" not in line]
    return {r[0]: r[1:] for r in rows}


def test_summary_markdown_shows_the_flip_table_and_evidence_recall():
    recs = random_math_run(2)
    s = json.loads(json.dumps(summarize(recs, n_boot=10, workflow="math_refine")))
    md = format_summary_markdown(s)
    m = s["effects"]["math"]
    heading = "### Why: what the math refinement workflow's agents did to the score"
    assert heading in md
    rows = _md_rows(md, heading)
    assert rows["figure"][-1] == "all"  # a benchmark per column, then all records
    words = {"wrong_to_right": "wrong -> right", "right_to_wrong": "right -> wrong", "wrong_to_wrong": "wrong -> wrong",
             "right_to_right": "right -> right"}
    assert [rows[words[k]][-1] for k in FLIPS] == [str(m["flips"][k]) for k in FLIPS]
    assert rows["round 2 ran (%)"][-1] == f"{100 * m['round2_rate']:.1f}"
    assert f"Of {m['episodes']} episodes, {m['round2_ran']} ran a second solver round" in md  # the declared note
    assert "### Where the time went: call latency per agent" in md

    recs = random_search_run(2)
    s = json.loads(json.dumps(summarize(recs, n_boot=10)))
    md = format_summary_markdown(s)
    e = s["effects"]["search"]
    rows = _md_rows(md, "### Why: what the search workflow's agents did to the score")
    assert rows["evidence recall (%)"][-1] == f"{100 * e['evidence_recall']:.1f}"
    assert rows["episodes where the answerer acted"][-1] == str(e["answerer_episodes"])


def test_old_records_still_summarise():
    """Records from before round-1 grades and the env record: the flip table leaves those episodes
    out (and says so), evidence figures are None, and a summary without effects renders."""
    math_old = random_math_run(4, episodes=12)
    for r in math_old:
        r["extra"].pop("round1_correct", None)
    m = summarize(math_old, n_boot=10)["effects"]["math"]
    two = sum(sum(t["agent"] == "solver" for t in r["turns"]) > 1 for r in math_old)
    assert m["round1_ungraded"] == m["round2_ran"] == two and sum(m["flips"].values()) == 0
    assert m["graded_episodes"] == len(math_old) - two

    search_old = random_search_run(4, episodes=8)
    for r in search_old:
        r["extra"].pop("env")
    s = summarize(search_old, n_boot=10)
    e = s["effects"]["search"]
    assert (e["env_recorded"], e["evidence_recall"], e["evidence_retrieved_rate"]) == (0, None, None)
    md = format_summary_markdown(json.loads(json.dumps(s)))
    rows = _md_rows(md, "### Why: what the search workflow's agents did to the score")
    assert rows["episodes with an env record"][-1] == "0" and rows["episodes"][-1] == str(len(search_old))
    hand = {"task": {"id": "1", "benchmark": "aime24"}, "turns": [{"agent": "solver", "completion": {}}]}
    s = summarize([hand], n_boot=10, workflow="math_refine")  # a solver alone would be inferred as math_single
    assert s["effects"]["math"]["round1_accuracy"] == 0.0
    del s["effects"]
    assert "agents did to the score" not in format_summary_markdown(s)


def test_leaderboard_rows_say_the_agents_effect():
    from drmas_bench.report.leaderboard import effect_label
    from drmas_bench.report.tables import Row, Table
    from drmas_bench.report.markdown import table_markdown

    recs = random_math_run(6)
    m = math_effects(recs)
    label = effect_label(recs, "math_refine")
    assert f"wrong->right {m['flips']['wrong_to_right']}, right->wrong {m['flips']['right_to_wrong']}" in label
    s = search_effects(random_search_run(6))
    assert f"evidence recall {100 * s['evidence_recall']:.0f}%" in effect_label(random_search_run(6), "search_route")
    assert effect_label(recs, "toy") == "–"
    for r in recs:
        r["extra"].pop("round1_correct", None)
    assert f"({m['round2_ran']} round-1 answers never graded)" in effect_label(recs, "math_refine")
    md = table_markdown(Table("math", "avg@n", ["aime24"], [Row("r", "reproduced", effect=label)]))
    assert "agents' effect" in md and label in md
