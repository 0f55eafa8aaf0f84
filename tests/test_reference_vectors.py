"""Parity with the reference's own code, family by family (../shared/reference_vectors, see its
MANIFEST.md). Each test runs our code on every case's input and compares with what the reference
returned; every family must agree 100%. Skipped with a reason where the folder is absent.

Families here: the boxed extraction (math_extract); the protocol of REFERENCE.md §2b (verdicts,
validity and projection per role, the search env's step, observation, history, team context, chat
layout, whole math and search episodes driven through our workflows); the QA reward (qa_em,
qa_normalize). The grader and the estimators have their own modules beside this one
(test_reference_vectors_*.py). docs/protocol.md maps each rule to the family that proves it.

Episodes are driven through `math_refine` / `search_route` with a scripted backend (`Scripted`: the
k-th call of an agent gets ``scripts[agent][k]``, or "" once the list runs out) and a fixed
retriever (`TableRetriever`). The role wording is ours, so the values the reference fills into its
templates are read back from OUR prompts through marker templates (`_markers`: every slot between
separators), and the packaged templates are checked to carry the same text (`test_episodes_search`
says how the env prompt is compared)."""

from __future__ import annotations

import asyncio

import pytest

from conftest import assert_all_agree, load_reference_cases
from drmas_bench.grading.extract import extract_boxed_strict, reference_boxed
from drmas_bench.grading.qa import empty_golds, grade_qa, normalize_qa
from drmas_bench.types import Completion, Sampling, Task
from drmas_bench.workflows import get_workflow
from protocol_roles import P
from drmas_bench.workflows.base import Episode
from drmas_retrieval import Hit

# the reference's agent names -> (our workflow agent, protocol role), per suite
AGENTS = {
    "math": {"Solver Agent": ("solver", "solver"), "Verifier Agent": ("verifier", "math_verifier")},
    "search": {"Verifier Agent": ("verifier", "search_verifier"), "Search Agent": ("searcher", "searcher"),
               "Answer Agent": ("answerer", "answerer")},
}
REF_NAME = {a: n for suite in AGENTS.values() for n, (a, _) in suite.items()}


# ------------------------------------------------------------------------------ boxed extraction


@pytest.mark.parametrize("rule,ours", [
    ("math_extract/whole_response", reference_boxed),   # the solver's validity reads this
    ("math_extract/grader", extract_boxed_strict),      # what reference_compat grades
])
def test_math_extract(rule, ours):
    cases = load_reference_cases("math_extract.jsonl", rule)

    def check(c):
        got = ours(c["input"]["response"])
        return got == c["reference"], got

    assert_all_agree(rule, cases, check)


# ------------------------------------------------------------------------------ single rules


@pytest.mark.parametrize("family,ours", [("math_verdict", P.math_verdict), ("search_verdict", P.search_verdict)])
def test_verdicts(family, ours):
    def check(c):
        got = ours(c["input"]["response"])
        return got == c["reference"], got

    assert_all_agree(family, load_reference_cases(f"{family}.jsonl"), check)


@pytest.mark.parametrize("role", ("solver", "math_verifier", "search_verifier", "searcher", "answerer"))
@pytest.mark.parametrize("family,ours", [("validity", P.valid), ("action", P.project)])
def test_validity_and_projection(family, ours, role):
    def check(c):
        assert c["input"]["role"] == role
        got = ours(role, c["input"]["response"])
        return got == c["reference"], got

    assert_all_agree(f"{family}/{role}", load_reference_cases(f"{family}.jsonl", f"{family}/{role}"), check)


def hits(pairs) -> list[Hit]:
    """[title, text] pairs as our retrievers return them (`Hit.contents` is the server's form)."""
    return [Hit(f"d{i}", title, text, 1.0) for i, (title, text) in enumerate(pairs)]


@pytest.mark.parametrize("role", ["searcher", "answerer"])
def test_step_outcome_of_one_action(role):
    """Step 1 of 4 with a fresh env: the role's projection, validity and the env's step."""
    def check(c):
        i = c["input"]
        env = P.SearchEnv(i["golds"], i["max_steps"])
        st = env.act(P.project(role, i["response"]))
        if st.query is not None:
            env.observe(P.observation(hits(i["retrieved"])))
        got = {"action": st.action, "valid": P.valid(role, i["response"]), "done": st.done, "reward": st.reward,
               "query": st.query, "observation": st.observation}
        return got == c["reference"], got

    family = f"step/{role}_action"
    assert_all_agree(family, load_reference_cases("step_outcome.jsonl", family), check)


def test_observation():
    def check(c):
        passages = c["input"]["passages"]
        ours = hits([(p["title"], p["text"]) for p in passages])
        assert [h.contents for h in ours] == [p["contents"] for p in passages]  # the server's form
        got = P.observation(ours)
        return got == c["reference"], got

    assert_all_agree("observation", load_reference_cases("observation.jsonl"), check)


def test_observation_of_an_empty_result_list():
    """The server's ``[]`` (no result list at all), a case the vectors do not hold (REFERENCE §2b)."""
    assert P.observation(None) == '<information>{"result": "No search results found."}</information>'


@pytest.mark.parametrize("rule", ["history", "history/window"])
def test_history(rule):
    tpl = P.default_templates("search_route")

    def check(c):
        steps = [P.EnvStep(n, s["action"], observation=s["observation"]) for n, s in enumerate(c["input"]["steps"], 1)]
        got = P.history(tpl, steps)
        return got == c["reference"], got

    assert_all_agree(rule, [c for c in load_reference_cases("history.jsonl", rule) if c["rule"] == rule], check)


@pytest.mark.parametrize("suite,workflow", [("math", "math_refine"), ("search", "search_route")])
def test_team_context(suite, workflow):
    tpl = P.default_templates(workflow)

    def check(c):
        said = [(AGENTS[suite][o["agent"]][0], P.project(AGENTS[suite][o["agent"]][1], o["response"]))
                for o in c["input"]["outputs"]]
        got = P.team_context(tpl, said)
        return got == c["reference"], got

    family = f"team_context/{suite}"
    assert_all_agree(family, load_reference_cases("team_context.jsonl", family), check)


def test_chat_layout():
    """Every call of both suites: the packaged system line, the whole prompt as the user message."""
    wf = {"math": "math_refine", "search": "search_route"}

    def check(c):
        i = c["input"]
        got = P.chat_messages(P.default_templates(wf[i["suite"]]).system, i["user_prompt"])
        return got == c["reference"], got

    assert_all_agree("chat", load_reference_cases("chat.jsonl"), check)


@pytest.mark.parametrize("family,ours", [
    ("qa_em", lambda i: int(grade_qa(i["prediction"], i["golds"]).em)),
    ("qa_normalize", lambda i: normalize_qa(i["text"])),
])
def test_qa(family, ours):
    def check(c):
        got = ours(c["input"])
        return got == c["reference"], got

    assert_all_agree(family, load_reference_cases("qa_em.jsonl", family), check)


# ------------------------------------------------------------------------------ whole episodes


class Scripted:
    """A fake AgentBackend: the k-th call of an agent gets scripts[reference name][k], or "" once
    the list runs out; every call is logged as (reference name, k, user prompt)."""

    def __init__(self, scripts: dict[str, list[str]], names: dict[str, str] | None = None):
        self.scripts = scripts
        self.names = REF_NAME if names is None else names  # our agent -> the reference's name
        self.calls: list[tuple[str, int, str]] = []

    def worker_group(self, agent: str) -> str:
        return "g"

    def sampling(self, agent: str) -> Sampling:
        return Sampling()

    async def generate(self, agent, request):
        name = self.names[agent]
        k = sum(1 for n, _, _ in self.calls if n == name)
        self.calls.append((name, k, request.messages[-1]["content"]))
        script = self.scripts.get(name, [])
        return Completion(text=script[k] if k < len(script) else "")


class TableRetriever:
    """The episode's fixed retrieval table, keyed by the query as sent (stripped); records queries."""

    def __init__(self, table):
        self.table, self.queries = table, []

    def search(self, queries, k):
        self.queries += list(queries)
        return [hits(self.table[q])[:k] for q in queries]


SEP = "\x1e"  # a separator no vector text holds (checked when the prompt is split)


def _markers(workflow: str) -> P.Templates:
    """Templates whose role prompts are every allowed slot, each after SEP + its name + SEP."""
    roles = {role: "".join(f"{SEP}{name}{SEP}{{{{{name}}}}}" for name in sorted(allowed))
             for role, (allowed, _) in P.placeholders(workflow).items()}
    return P.load_templates(workflow, ({"roles": roles}, "markers"))


def _slots(prompt: str) -> dict[str, str]:
    parts = prompt.split(SEP)[1:]
    return dict(zip(parts[0::2], parts[1::2]))


def _run(workflow: str, task: Task, scripts, prompts: P.Templates, retriever=None):
    wf = get_workflow(workflow)
    backend = Scripted(scripts)
    ep = Episode(task, 0, backend, wf.agents, retriever=retriever)
    asyncio.run(wf.fn(ep, **{**wf.defaults, "prompts": prompts}))
    return ep.finish(), backend


def _response(scripts, name, k):
    s = scripts.get(name, [])
    return s[k] if k < len(s) else ""


def test_episodes_math():
    """calls (agent, k, valid, the team context in the prompt), final answer; the packaged prompts
    carry the same context text."""
    tpl = _markers("math_refine")
    packaged = P.default_templates("math_refine")

    def check(c):
        i, ref = c["input"], c["reference"]
        task = Task("m", "aime24", "Q", [i["gold"]])
        traj, b = _run("math_refine", task, i["scripts"], tpl)
        calls = [{"agent": n, "k": k, "valid": t.valid, "team_context": _slots(p)["team_context"]}
                 for (n, k, p), t in zip(b.calls, traj.turns)]
        got = {"calls": calls, "final_answer": traj.final_answer}
        _, b2 = _run("math_refine", task, i["scripts"], packaged)
        same_text = [p.count(x["team_context"]) >= 1 for (_, _, p), x in zip(b2.calls, ref["calls"])]
        ok = got == {k: ref[k] for k in got} and all(same_text) and len(b2.calls) == len(ref["calls"])
        return ok, got

    assert_all_agree("episode/math", load_reference_cases("episodes_math.jsonl"), check)


def test_episodes_math_reward():
    """The math env grades the final answer (the last solver output, whole) with the reference
    grader; ours is `reference_compat` on the same text."""
    from drmas_bench.grading.graders import grade_math

    def check(c):
        got = float(grade_math(c["reference"]["final_answer"], c["input"]["gold"], backend="reference_compat"))
        return got == c["reference"]["reward"], got

    assert_all_agree("episode/math reward", load_reference_cases("episodes_math.jsonl"), check)


def test_episodes_search():
    """calls (step, agent, k, valid, projected, team context), steps (history, action, done,
    reward, query, observation), episode reward, length, won, answer; and the env prompt's
    structure.

    The env prompt's wording is ours, so of it we compare: the history slot (equal to the
    reference's ``history`` text from step 2 on; at step 1 the reference shows no history and we
    show the ``history_empty`` part), the step number and the count of earlier steps (the
    reference's "taken {t-1} step(s)"), and that the packaged prompt of every call holds the
    reference's history text verbatim. The Answer Agent's team context never reaches its prompt in
    the reference (its template has no slot); ours is read from the marker slot, which the packaged
    answerer prompt does not use either."""
    tpl = _markers("search_route")
    packaged = P.default_templates("search_route")

    def check(c):
        i, ref = c["input"], c["reference"]
        task = Task("s", "hotpotqa", i["question"], i["golds"])
        retr = TableRetriever(i["retrieval"])
        traj, b = _run("search_route", task, i["scripts"], tpl, retr)
        slots = [_slots(p) for _, _, p in b.calls]
        assert all(len(p.split(SEP)) == 2 * len(s) + 1 for (_, _, p), s in zip(b.calls, slots))
        calls = [{"step": int(s["step"]), "agent": n, "k": k, "valid": t.valid,
                  "projected": P.project(AGENTS["search"][n][1], _response(i["scripts"], n, k)),
                  "team_context": s["team_context"]}
                 for (n, k, _), s, t in zip(b.calls, slots, traj.turns)]
        env = traj.extra["env"]
        first_call = {x["step"]: s for x, s in zip(calls, slots) if x["agent"] == "Verifier Agent"}
        steps = []
        for st in env["steps"]:
            s = first_call[st["step"]]
            assert int(s["prior_steps"]) == st["step"] - 1
            history = "" if s["history"] == packaged.parts["history_empty"] and st["step"] == 1 else s["history"]
            steps.append({"step": st["step"], "history": history,
                          **{k: st[k] for k in ("action", "done", "reward", "query", "observation")}})
        got = {"calls": calls, "steps": steps, "reward": env["reward"], "length": env["length"],
               "won": float(env["won"]), "answer": env["answer"]}
        want = {**ref, "steps": [{k: v for k, v in st.items() if k != "env_prompt"} for st in ref["steps"]]}
        if empty_golds(i["golds"]) and not grade_qa(ref["answer"] or "", i["golds"]).em:
            # our one chosen difference: a gold that normalises to "" (`The The`) is matched by its
            # spelling only, where the reference pays EM 1 to any answer that normalises to "" too
            want = {**want, "reward": 0.0, "won": 0.0,
                    "steps": [{**st, "reward": 0.0 if st["done"] else st["reward"]} for st in want["steps"]]}
        ok = got == want and traj.final_answer == ref["answer"]
        # the env prompt: the reference's own text holds its history and the count of earlier steps
        ok = ok and all(st["history"] in st["env_prompt"] and (st["step"] == 1 or
                        f"taken {st['step'] - 1} step(s)" in st["env_prompt"]) for st in ref["steps"])
        # the packaged prompts carry the reference's history text verbatim, at every call of its step
        _, b2 = _run("search_route", task, i["scripts"], packaged, TableRetriever(i["retrieval"]))
        hist = {st["step"]: st["history"] for st in ref["steps"]}
        ok = ok and len(b2.calls) == len(ref["calls"]) and all(
            hist[x["step"]] in p for x, (_, _, p) in zip(ref["calls"], b2.calls))
        # what the qa grader makes of the final answer is the env's reward
        ok = ok and grade_qa(traj.final_answer, i["golds"]).em == want["reward"]
        return ok, got

    assert_all_agree("episode/search", load_reference_cases("episodes_search.jsonl"), check)


def test_step_outcome_orchestrated():
    """Step t of an episode whose steps 1..t-1 were empty (the verifier said no, the searcher wrote
    nothing), driven through `search_route`: verdict, the calls of step t, the env's step."""
    tpl = _markers("search_route")

    def check(c):
        i, t = c["input"], c["input"]["step"]
        scripts = {"Verifier Agent": ["<verify>no</verify>"] * (t - 1) + [i["verifier"]],
                   "Search Agent": [""] * (t - 1) + [i["searcher"]], "Answer Agent": [i["answerer"]]}
        retr = TableRetriever({})
        retr.search = lambda qs, k: [hits(i["retrieved"])[:k] for _ in qs]
        traj, b = _run("search_route", Task("s", "hotpotqa", "Q?", i["golds"]), scripts, tpl, retr)
        st = traj.extra["env"]["steps"][t - 1]
        at_t = [(call, turn) for call, turn in zip(b.calls, traj.turns) if _slots(call[2])["step"] == str(t)]
        got = {"verdict": P.search_verdict(i["verifier"]),
               "calls": [{"agent": n, "valid": turn.valid} for (n, _, _), turn in at_t],
               **{k: st[k] for k in ("action", "done", "reward", "query", "observation")}}
        return got == c["reference"] and len(traj.extra["env"]["steps"]) >= t, got

    assert_all_agree("step/orchestrated", load_reference_cases("step_outcome.jsonl", "step/orchestrated"), check)
