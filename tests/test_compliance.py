"""Protocol compliance in run summaries (metrics.compliance): checked against a plain reference
implementation written here from REFERENCE.md §2b on random recorded runs, against the validity
the workflows record, and on records older than compliance (which must still summarise)."""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter

import pytest

from drmas_bench.metrics import compliance, infer_workflow, invalid_reasons, role_rules, summarize
from drmas_bench.report.markdown import format_summary_markdown
from drmas_bench.types import Completion, Sampling, Task
from drmas_bench.suites.search.rules import action_kind
from protocol_roles import P
from drmas_bench.workflows.base import Episode

# ------------------------------------------------------------------ a plain reference implementation

CJK = ("\u4e00", "\u9fff")
OWN_TAG = {"searcher": "search", "answerer": "answer"}


def plain_boxed_ok(text: str) -> bool:
    """The reference's extraction on the whole response: the last \\boxed, braces counted from it."""
    at = text.rfind("\\boxed")
    if at < 0:
        return False
    depth = 0
    for i in range(at, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[at:i + 1].startswith("\\boxed{")
    return False


def cjk(text: str) -> bool:
    return any(CJK[0] <= ch <= CJK[1] for ch in text)


ROLES = ("solver", "math_verifier", "search_verifier", "searcher", "answerer")  # the protocol's five roles


def plain_reasons(rule: str, text: str) -> list[str]:
    out = []
    if rule in ("search_verifier", "math_verifier") and not ("<verify>" in text and "</verify>" in text):
        out.append("missing_verify_tag")
    if rule in OWN_TAG:
        tag = OWN_TAG[rule]
        if not (f"<{tag}>" in text and f"</{tag}>" in text):
            out.append("missing_action_tag")
        if text.count("<think>") != 1 or text.count("</think>") != 1:
            out.append("think_count")
        elif text.index("</think>") < text.index("<think>"):
            out.append("think_order")
    if rule == "solver":
        if "\\boxed" not in text:
            out.append("missing_boxed")
        elif not plain_boxed_ok(text):
            out.append("unbalanced_boxed")
    if rule != "solver" and cjk(text):
        out.append("cjk")
    return out


def plain_kind(agent: str, text: str) -> str:
    """REFERENCE 2b: each role reads its own tag only; an action holding an answer pair ends the episode."""
    tag = OWN_TAG[agent]
    i, j = text.find(f"<{tag}>"), text.find(f"</{tag}>")
    if i < 0 or j < 0:
        return "empty"
    inner = text[i + len(tag) + 2:j] if i < j else ""
    if "<answer>" in inner and "</answer>" in inner or agent == "answerer":
        return "answer"
    return "search"


def plain_search_route(recs: list[dict]) -> dict:
    """Per episode: steps, searches, empty steps (a step before the last with no usable action);
    answered share; per agent: calls, valid, reasons, cut-offs, action kinds."""
    per_agent: dict[str, dict] = {}
    searches, empties, steps, answered = [], [], [], []
    for r in recs:
        s = e = t_now = 0
        for t in r["turns"]:
            text, name = t["completion"]["text"], t["agent"]
            a = per_agent.setdefault(name, {"calls": 0, "valid": 0, "reasons": Counter(), "cut": 0, "kinds": Counter()})
            a["calls"] += 1
            a["valid"] += t["valid"]
            a["cut"] += t["completion"]["finish"] == "length"
            a["reasons"].update(plain_reasons(role_rules("search_route")[name].name, text))
            if name == "verifier":
                t_now += 1
                continue
            kind = plain_kind(name, text)
            a["kinds"][kind] += 1
            s += kind == "search" and t_now < 4
            e += kind == "empty" and t_now < 4
        searches.append(s)
        empties.append(e)
        steps.append(t_now)
        answered.append(r["final_answer"] is not None)
    n = len(recs)
    return {"agents": per_agent, "searches": sum(searches) / n, "empty": sum(empties) / n, "steps": sum(steps) / n,
            "answered": sum(answered) / n, "dist": Counter(searches)}


# ------------------------------------------------------------------ random recorded runs (the real workflow)

PIECES = ["<think>", "</think>", "<search>", "</search>", "<answer>", "</answer>", "<verify>", "</verify>",
          "yes", "no", "approve", "reject", "\u4e2d", "\u3042", "\\boxed{", "\\boxed", "{", "}", "5", " ", "\n",
          "<SEARCH>", "<Think>", "Paris"]


WELL_FORMED = {
    "verifier": ["<verify>no</verify>", "<verify> No </verify>", "<verify>yes</verify>"],
    "searcher": ["<think>x</think><search>q</search>", "<search>q <answer>Paris</answer></search>", "<search></search>"],
    "answerer": ["<think>x</think><answer>Paris</answer>", "<answer>Rome</answer>"],
}


def random_text(rng: random.Random, agent: str | None = None) -> str:
    """Noise from the protocol's pieces, often around a well-formed response of `agent`."""
    def noise() -> str:
        return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 4)))
    core = rng.choice(WELL_FORMED[agent]) if agent and rng.random() < 0.7 else ""
    return noise() + core + noise()


class RandomBackend:
    """Answers every call with a random mix of the protocol's tags (and some noise)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def worker_group(self, agent: str) -> str:
        return "shared"

    def sampling(self, agent: str) -> Sampling:
        return Sampling(max_new_tokens=8)

    async def generate(self, agent: str, request) -> Completion:
        return Completion(random_text(self.rng, agent), finish=self.rng.choice(["stop", "length"]))


class FakeRetriever:
    def search(self, queries, k):
        return [[{"title": "T", "text": f"about {q}"} for _ in range(k)] for q in queries]


def random_search_run(seed: int, episodes: int = 30, keep_env: bool = True) -> list[dict]:
    """Episodes of the real search_route workflow with random responses, as samples.jsonl holds them."""
    from drmas_bench.suites.search.search_route import search_route

    rng = random.Random(seed)
    recs = []
    for i in range(episodes):
        task = Task(id=f"q{i // 2}", benchmark="hotpotqa", question="Where is it?", answers=["Paris"])
        ep = Episode(task, i % 2, RandomBackend(rng), ("verifier", "searcher", "answerer"), retriever=FakeRetriever())
        asyncio.run(search_route(ep))
        d = json.loads(json.dumps(ep.finish().to_dict()))
        if not keep_env:
            d["extra"].pop("env", None)
        recs.append(d)
    return recs


@pytest.mark.parametrize("seed", range(6))
def test_search_compliance_matches_the_plain_implementation(seed):
    recs = random_search_run(seed)
    got = compliance(recs, "search_route")
    want = plain_search_route(recs)
    ep = got["episodes"]
    assert ep["episodes"] == len(recs)
    assert ep["searches_per_episode"] == pytest.approx(want["searches"])
    assert ep["empty_steps_per_episode"] == pytest.approx(want["empty"])
    assert ep["steps_per_episode"] == pytest.approx(want["steps"])
    assert ep["answer_tag_rate"] == pytest.approx(want["answered"])
    assert ep["no_answer_rate"] == pytest.approx(1 - want["answered"])
    assert ep["searches_distribution"] == {str(k): v for k, v in sorted(want["dist"].items())}
    assert set(got["agents"]) == set(want["agents"])
    for name, a in want["agents"].items():
        g = got["agents"][name]
        assert (g["calls"], g["valid"], g["length_cut"]) == (a["calls"], a["valid"], a["cut"])
        assert g["valid_rate"] == pytest.approx(a["valid"] / a["calls"])
        assert g["valid_by_rules"] == g["valid"]  # recorded by the workflow under today's rules
        assert g["invalid_reasons"] == {k: v for k, v in a["reasons"].items() if v}
        order = role_rules("search_route")[name].reason_names  # the rule's own order of its reasons
        assert list(g["invalid_reasons"]) == [k for k in order if k in g["invalid_reasons"]]  # table order
        # the recorded validity is the plain rule's: no reason <=> valid
        if name != "verifier":
            assert g["actions"] == {k: a["kinds"][k] for k in ("search", "answer", "empty")}
            assert g["answer_tag_rate"] == pytest.approx(a["kinds"]["answer"] / a["calls"])


@pytest.mark.parametrize("seed", range(3))
def test_recorded_validity_is_the_plain_rule(seed):
    for r in random_search_run(50 + seed, episodes=10):
        for t in r["turns"]:
            assert t["valid"] == (not plain_reasons(role_rules("search_route")[t["agent"]].name, t["completion"]["text"]))


def test_verdicts_follow_the_router():
    recs = random_search_run(9)
    ver = [t["completion"]["text"] for r in recs for t in r["turns"] if t["agent"] == "verifier"]
    routes = Counter(P.search_verdict(x) for x in ver)
    assert compliance(recs)["agents"]["verifier"]["verdicts"] == dict(sorted(routes.items()))
    # every "search" verdict before the last step is followed by a searcher turn
    n_search_calls = sum(t["agent"] == "searcher" for r in recs for t in r["turns"])
    assert n_search_calls <= routes["search"]


def test_records_without_the_env_account_read_the_texts():
    """Runs from before the env record (extra["env"]) count searches from the searcher's and the
    answerer's texts; with the record, the env's own steps count (the last step is never empty)."""
    with_env = random_search_run(21, episodes=12)
    without = random_search_run(21, episodes=12, keep_env=False)
    a, b = compliance(with_env)["episodes"], compliance(without)["episodes"]
    assert a["searches_per_episode"] == b["searches_per_episode"]  # a search happens only before the last step
    kinds = [action_kind(t["agent"], t["completion"]["text"]) for r in without for t in r["turns"]
             if t["agent"] != "verifier"]
    assert b["empty_steps_per_episode"] == pytest.approx(kinds.count("empty") / len(without))


def test_reasons_agree_with_the_validity_the_workflows_record():
    """One definition: a response has no reason exactly when the protocol's check passes."""
    rng = random.Random(7)
    for _ in range(3000):
        text = random_text(rng)
        for role in ROLES:
            assert (not invalid_reasons(role, text)) == P.valid(role, text), (role, text)
            assert (not invalid_reasons(role, text)) == (not plain_reasons(role, text)), (role, text)


@pytest.mark.parametrize("rule, text, want", [
    ("search_verifier", "ok <verify>yes</verify>", []),
    ("math_verifier", "ok <verify>yes", ["missing_verify_tag"]),
    ("search_verifier", "\u4e2d", ["missing_verify_tag", "cjk"]),
    ("searcher", "<think>a</think><search>q</search>", []),
    ("searcher", "<search>q</search>", ["think_count"]),
    ("searcher", "<think>a</think><answer>q</answer>", ["missing_action_tag"]),  # its own tag only
    ("answerer", "</think>x<think><answer>a</answer>", ["think_order"]),
    ("answerer", "<think>a</think> Paris", ["missing_action_tag"]),
    ("answerer", "<think><think></think>", ["missing_action_tag", "think_count"]),
    ("solver", "so \\boxed{5}", []),
    ("solver", "\u4e2d\u6587 \\boxed{5}", []),  # the solver has no CJK rule
    ("solver", "so 5", ["missing_boxed"]),
    ("solver", "\\boxed{5} \\boxed{", ["unbalanced_boxed"]),
    ("toy_answer", "<answer>3</answer>", []),
    ("toy_answer", "3", ["missing_answer_tag"]),
    ("toy_verdict", "<verdict>approve</verdict>", []),
    ("toy_verdict", "fine", ["missing_verdict_tag"]),
])
def test_reasons_by_hand(rule, text, want):
    assert invalid_reasons(rule, text) == want


def test_math_episodes_rounds_and_approvals():
    def t(agent, text):
        return {"agent": agent, "valid": True, "completion": {"text": text}}
    recs = [
        {"task": {"id": "a", "benchmark": "aime24"}, "turns": [t("solver", "\\boxed{1}"), t("verifier", "<verify>approve</verify>")]},
        {"task": {"id": "b", "benchmark": "aime24"}, "turns": [t("solver", "2"), t("verifier", "<verify>reject</verify>"),
                                                               t("solver", "\\boxed{3}")]},
    ]
    c = compliance(recs)
    assert c["workflow"] == "math_refine"
    assert c["episodes"] == {"episodes": 2, "rounds_per_episode": 1.5, "approve_rate": 0.5}
    assert c["agents"]["solver"]["invalid_reasons"] == {"missing_boxed": 1}
    assert c["agents"]["verifier"]["verdicts"] == {"approve": 1, "reject": 1}


def test_workflow_is_inferred_from_the_agents():
    def rec(*agents):
        return {"turns": [{"agent": a} for a in agents]}
    assert infer_workflow([rec("verifier", "searcher")]) == "search_route"
    assert infer_workflow([rec("verifier"), rec("verifier", "answerer")]) == "search_route"
    assert infer_workflow([rec("solver", "checker")]) == "toy"
    assert infer_workflow([rec("solver", "verifier")]) == "math_refine"
    assert infer_workflow([rec("solver", "critic", "refiner", "verifier")]) == "math_4agent"
    assert infer_workflow([rec("solver")]) == "math_single"  # the fewest agents that hold every one named
    assert infer_workflow([rec("planner")]) is None


def test_old_records_still_summarise_and_render():
    """A record as an early version wrote it: no finish, no valid flag, no final_answer, no text."""
    old = {"task": {"id": "1", "benchmark": "hotpotqa", "question": "q"}, "sample_idx": 0, "correct": False,
           "turns": [{"agent": "verifier", "wg": "m", "step": 0, "completion": {"prompt_tokens": 3}},
                     {"agent": "answerer", "wg": "m", "step": 1, "completion": {"text": "<answer>x</answer>"}}]}
    s = summarize([old], n_boot=10)
    c = s["compliance"]
    assert c["workflow"] == "search_route"
    assert c["agents"]["verifier"] == {"rule": "search_verifier", "calls": 1, "valid": 1, "valid_rate": 1.0,
                                       "invalid_reasons": {"missing_verify_tag": 1}, "valid_by_rules": 0,
                                       "valid_by_rules_rate": 0.0, "length_cut": 0,
                                       "empty_responses": 1, "verdicts": {"answer": 1}}
    assert c["episodes"]["answer_tag_rate"] == 0.0  # no final_answer recorded
    assert c["agents"]["answerer"]["actions"] == {"search": 0, "answer": 1, "empty": 0}  # read from its text
    md = format_summary_markdown(json.loads(json.dumps(s)))
    assert "### Why: protocol compliance of the search workflow, per agent" in md and "no `<verify>` tag 1" in md
    assert "100% (valid under today's rules: 0%)" in md  # recorded valid (no flag: True) but not under today's rules
    # a summary.json written before compliance existed renders without the section
    del s["compliance"]
    assert "protocol compliance" not in format_summary_markdown(s)


def test_summary_markdown_explains_a_search_run():
    recs = random_search_run(3, episodes=10)
    s = summarize(recs, n_boot=10, workflow="search_route")
    md = format_summary_markdown(s)
    ep = s["compliance"]["episodes"]
    # every per-episode figure the rules declare, under its own label
    assert f"searches per episode: {ep['searches_per_episode']:.2f}" in md
    assert f"ended on a tagged answer (%): {100 * ep['answer_tag_rate']:.1f}" in md
    # and every per-agent figure: the actors' actions and their answer share, the verifier's verdicts
    actor = s["compliance"]["agents"]["searcher"]
    assert f"actions: search {actor['actions']['search']}, answer {actor['actions']['answer']}" in md
    assert f"ended on a tagged answer (%): {100 * actor['answer_tag_rate']:.1f}" in md
    for name, a in s["compliance"]["agents"].items():
        assert f"| {name} " in md and f"{100 * a['valid_rate']:.0f}%" in md
