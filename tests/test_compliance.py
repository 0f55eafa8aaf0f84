"""Protocol compliance in run summaries (metrics.compliance): checked against a plain reference
implementation written here from REFERENCE.md §2b on random recorded runs, against the validity
the workflows record, and on records older than compliance (which must still summarise)."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from drmas_bench.metrics import REASONS, ROLE_RULES, compliance, infer_workflow, invalid_reasons, summarize
from drmas_bench.report.markdown import format_summary_markdown
from drmas_bench.workflows import protocol as P

# ------------------------------------------------------------------ a plain reference implementation

CJK = ("\u4e00", "\u9fff")


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


def plain_reasons(rule: str, text: str) -> list[str]:
    out = []
    if rule == "verify" and not ("<verify>" in text and "</verify>" in text):
        out.append("missing_verify_tag")
    if rule == "action":
        has_pair = any(f"<{t}>" in text and f"</{t}>" in text for t in ("search", "answer"))
        if not has_pair:
            out.append("missing_action_tag")
        if text.count("<think>") != 1 or text.count("</think>") != 1:
            out.append("think_count")
        elif text.index("</think>") < text.index("<think>"):
            out.append("think_order")
    if rule == "boxed":
        if "\\boxed" not in text:
            out.append("missing_boxed")
        elif not plain_boxed_ok(text):
            out.append("unbalanced_boxed")
    if rule in ("verify", "action", "boxed") and any(CJK[0] <= ch <= CJK[1] for ch in text):
        out.append("cjk")
    return out


def plain_action(text: str) -> str:
    for kind in ("search", "answer"):
        if f"<{kind}>" in text and f"</{kind}>" in text:
            return kind
    return "empty"


def plain_search_route(recs: list[dict]) -> dict:
    """searches, empty steps, steps per episode; answered share; per agent: valid share and reasons."""
    per_agent: dict[str, dict] = {}
    searches, empties, steps, answered = [], [], [], []
    for r in recs:
        s = e = v = 0
        for t in r["turns"]:
            text, name = t["completion"]["text"], t["agent"]
            a = per_agent.setdefault(name, {"calls": 0, "valid": 0, "reasons": Counter(), "cut": 0})
            a["calls"] += 1
            a["valid"] += t["valid"]
            a["cut"] += t["completion"]["finish"] == "length"
            a["reasons"].update(plain_reasons(ROLE_RULES["search_route"][name], text))
            if name == "verifier":
                v += 1
            else:
                s += plain_action(text) == "search"
                e += plain_action(text) == "empty"
        searches.append(s)
        empties.append(e)
        steps.append(v)
        answered.append(r["final_answer"] is not None)
    n = len(recs)
    return {"agents": per_agent, "searches": sum(searches) / n, "empty": sum(empties) / n, "steps": sum(steps) / n,
            "answered": sum(answered) / n, "dist": Counter(searches)}


# ------------------------------------------------------------------ random recorded runs

PIECES = ["<think>", "</think>", "<search>", "</search>", "<answer>", "</answer>", "<verify>", "</verify>",
          "yes", "no", "approve", "reject", "\u4e2d", "\u3042", "\\boxed{", "\\boxed", "{", "}", "5", " ", "\n",
          "<SEARCH>", "<Think>", "Paris"]


def random_text(rng: random.Random) -> str:
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 12)))


def random_turn(rng: random.Random, agent: str, step: int) -> dict:
    return {"agent": agent, "wg": "shared", "step": step, "valid": rng.random() < 0.5,
            "request": {"agent": agent, "messages": []},
            "completion": {"text": random_text(rng), "prompt_tokens": 10, "completion_tokens": 5,
                           "finish": rng.choice(["stop", "length"]), "latency_s": 0.1}}


def random_search_run(seed: int, episodes: int = 30) -> list[dict]:
    rng = random.Random(seed)
    recs = []
    for i in range(episodes):
        turns = []
        for step in range(rng.randint(1, 4)):
            turns.append(random_turn(rng, "verifier", len(turns)))
            if rng.random() < 0.9:
                turns.append(random_turn(rng, rng.choice(["searcher", "answerer"]), len(turns)))
        recs.append({"task": {"id": f"q{i // 2}", "benchmark": "hotpotqa", "question": "q?", "answers": ["Paris"]},
                     "sample_idx": i % 2, "turns": turns, "final_answer": rng.choice([None, "Paris"]),
                     "reward": 0.0, "correct": False, "extra": {}, "wall_s": 1.0, "cost_usd": 0.0})
    return recs


@pytest.mark.parametrize("seed", range(8))
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
        assert g["invalid_reasons"] == {k: v for k, v in a["reasons"].items() if v}
        assert list(g["invalid_reasons"]) == [k for k in REASONS if k in g["invalid_reasons"]]  # table order


@pytest.mark.parametrize("seed", range(4))
def test_action_counts_and_verdicts_follow_the_environment(seed):
    recs = random_search_run(100 + seed)
    got = compliance(recs, "search_route")["agents"]
    for name in ("searcher", "answerer"):
        texts = [t["completion"]["text"] for r in recs for t in r["turns"] if t["agent"] == name]
        if not texts:
            continue
        kinds = Counter(plain_action(x) for x in texts)
        assert got[name]["actions"] == {k: kinds[k] for k in ("search", "answer", "empty")}
        assert got[name]["answer_tag_rate"] == pytest.approx(kinds["answer"] / len(texts))
    ver = [t["completion"]["text"] for r in recs for t in r["turns"] if t["agent"] == "verifier"]
    routes = Counter("answer" if "<verify>yes</verify>" in x.lower() or "<verify>no</verify>" not in x.lower()
                     else "search" for x in ver)
    assert got["verifier"]["verdicts"] == dict(sorted(routes.items()))


def test_reasons_agree_with_the_validity_the_workflows_record():
    """One definition: a response has no reason exactly when the protocol's check passes."""
    rng = random.Random(7)
    checks = {"verify": P.verify_valid, "action": P.action_valid, "boxed": P.solver_valid}
    for _ in range(3000):
        text = random_text(rng)
        for rule, valid in checks.items():
            assert (not invalid_reasons(rule, text)) == valid(text), (rule, text)


@pytest.mark.parametrize("rule, text, want", [
    ("verify", "ok <verify>yes</verify>", []),
    ("verify", "ok <verify>yes", ["missing_verify_tag"]),
    ("verify", "\u4e2d", ["missing_verify_tag", "cjk"]),
    ("action", "<think>a</think><search>q</search>", []),
    ("action", "<search>q</search>", ["think_count"]),
    ("action", "</think>x<think><answer>a</answer>", ["think_order"]),
    ("action", "<think>a</think> Paris", ["missing_action_tag"]),
    ("action", "<think><think></think>", ["missing_action_tag", "think_count"]),
    ("boxed", "so \\boxed{5}", []),
    ("boxed", "so 5", ["missing_boxed"]),
    ("boxed", "\\boxed{5} \\boxed{", ["unbalanced_boxed"]),
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
    assert infer_workflow([rec("planner")]) is None


def test_old_records_still_summarise_and_render():
    """A record as an early version wrote it: no finish, no valid flag, no final_answer, no text."""
    old = {"task": {"id": "1", "benchmark": "hotpotqa", "question": "q"}, "sample_idx": 0, "correct": False,
           "turns": [{"agent": "verifier", "wg": "m", "step": 0, "completion": {"prompt_tokens": 3}},
                     {"agent": "answerer", "wg": "m", "step": 1, "completion": {"text": "<answer>x</answer>"}}]}
    s = summarize([old], n_boot=10)
    c = s["compliance"]
    assert c["workflow"] == "search_route"
    assert c["agents"]["verifier"] == {"rule": "verify", "calls": 1, "valid": 1, "valid_rate": 1.0,
                                       "invalid_reasons": {"missing_verify_tag": 1}, "length_cut": 0,
                                       "empty_responses": 1, "verdicts": {"answer": 1}}
    assert c["episodes"]["answer_tag_rate"] == 0.0  # no final_answer recorded
    md = format_summary_markdown(json.loads(json.dumps(s)))
    assert "### Protocol compliance" in md and "missing verify tag 1" in md
    # a summary.json written before compliance existed renders without the section
    del s["compliance"]
    assert "Protocol compliance" not in format_summary_markdown(s)


def test_summary_markdown_explains_a_search_run():
    recs = random_search_run(3, episodes=10)
    s = summarize(recs, n_boot=10, workflow="search_route")
    md = format_summary_markdown(s)
    ep = s["compliance"]["episodes"]
    assert f"{ep['searches_per_episode']:.2f} searches" in md
    assert f"ended on a tagged answer: {100 * ep['answer_tag_rate']:.0f}%" in md
    for name, a in s["compliance"]["agents"].items():
        assert f"| {name} " in md and f"{100 * a['valid_rate']:.0f}%" in md
