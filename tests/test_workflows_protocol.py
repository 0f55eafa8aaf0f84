"""The interface protocol of REFERENCE.md §2b, rule by rule, and the two paper workflows driven by a
scripted agent backend (`FakeScriptedAgents`: a fake, for workflow logic only; no model runs)."""

from __future__ import annotations

import asyncio
import json

import pytest
import yaml

from drmas_bench.agents.team import build_team
from drmas_bench.retrievers import retriever_record
from drmas_bench.types import Completion, Request, Sampling, Task, UserError
from drmas_bench.workflows import get_workflow
from protocol_roles import P
from drmas_bench.workflows.base import Episode
from drmas_retrieval import Hit


class FakeScriptedAgents:
    """A fake AgentBackend: each agent answers from its own script (list of texts, or a function of
    the request); every request is recorded in call order."""

    def __init__(self, **scripts):
        self.scripts = {a: (list(s) if isinstance(s, list) else s) for a, s in scripts.items()}
        self.calls: list[tuple[str, Request]] = []

    def worker_group(self, agent: str) -> str:
        return "shared"

    def sampling(self, agent: str) -> Sampling:
        return Sampling()

    async def generate(self, agent: str, request: Request) -> Completion:
        self.calls.append((agent, request))
        s = self.scripts[agent]
        text = s(request) if callable(s) else s.pop(0)
        return Completion(text=text, prompt_truncated="TRUNCATE-ME" in request.messages[-1]["content"])

    @property
    def agents(self) -> list[str]:
        return [a for a, _ in self.calls]

    def user(self, i: int) -> str:
        return self.calls[i][1].messages[-1]["content"]


class FakeRetriever:
    """Records queries; returns fixed passages."""

    def __init__(self):
        self.queries: list[str] = []

    def search(self, queries, k):
        self.queries += list(queries)
        return [[Hit(f"d{i}", f'Title "{i}"', f"text {i} café\nline2", 1.0) for i in range(1, k + 1)] for _ in queries]


TASK = Task("t1", "hotpotqa", "Who wrote Hamlet?", ["William Shakespeare"])
MTASK = Task("m1", "aime24", "What is 1+1?", ["2"])
V = "<verify>{}</verify>"
SEARCH = "<think>need more</think><search>{}</search>"
ANSWER = "<think>found it</think><answer>{}</answer>"


def run_wf(name, task, backend, retriever=None, **opts):
    wf = get_workflow(name)
    ep = Episode(task, 0, backend, wf.agents, seed=0, retriever=retriever)
    asyncio.run(wf.fn(ep, **{**wf.defaults, **opts}))
    return ep.finish()


# ------------------------------------------------------------------------------ parsing


def test_tag_action_keeps_its_tags_and_takes_the_first_occurrences():
    assert P.tag_action("<answer> a </answer> <answer>b</answer>", "answer") == "<answer>a</answer>"
    assert P.tag_action("<answer>a", "answer") == "" and P.tag_action("a</answer>", "answer") == ""
    assert P.tag_action("</answer> x <answer>y</answer>", "answer") == "<answer></answer>"  # close first
    assert P.tag_action("<search>q <answer>a</answer></search>", "search") == "<search>q <answer>a</answer></search>"


@pytest.mark.parametrize("role,text,action", [
    ("searcher", "<think>t</think><answer>x</answer>", ""),  # cross-tagged: an empty step, not an answer
    ("answerer", "<think>t</think><search>q</search>", ""),  # cross-tagged: an empty step, not a search
    ("answerer", "<search>q</search><answer> a </answer>", "<answer>a</answer>"),  # its own tag only
    ("searcher", "<SEARCH>q</SEARCH>", ""),
    ("solver", " keep \\boxed{1} as is ", " keep \\boxed{1} as is "),
    ("math_verifier", "ok <verify> re ject </verify> <verify> x </verify>", "ok <verify>re ject</verify> <verify> x </verify>"),
    ("search_verifier", "</verify>no<verify>", "</verify>no<verify></verify>no<verify>"),  # the reference's slicing
])
def test_projection_per_role(role, text, action):
    assert P.project(role, text) == action


@pytest.mark.parametrize("text,verdict", [
    (V.format("approve"), "approve"),
    (V.format("reject"), "reject"),
    ("<verify> \n reject\t</verify>", "reject"),  # whitespace inside the first pair is stripped
    (V.format("Reject"), "approve"),  # case-sensitive: unparsable -> approve
    (V.format("REJECT"), "approve"),
    ("I reject this.", "approve"),  # no tag -> approve
    ("<verify>maybe</verify>", "approve"),
    ("<verify>reject</verify> ... <verify>approve</verify>", "approve"),  # approve is tested first
    ("<verify>no idea</verify> then <verify>reject</verify>", "reject"),
    ("<verify> approve </verify> <verify> reject </verify>", "approve"),
    ("<verify>x</verify> <verify> reject </verify>", "approve"),  # only the FIRST pair is stripped
    ("<verify>re ject</verify>", "approve"),  # strip = the ends only (an earlier reading removed all spaces)
])
def test_math_verdict(text, verdict):
    assert P.math_verdict(text) == verdict


@pytest.mark.parametrize("text,route", [
    (V.format("yes"), "answer"), (V.format("no"), "search"), ("<VERIFY>No</VERIFY>", "search"),
    ("nothing", "answer"), ("<verify> no </verify>", "search"),  # the test runs on the spliced text
    ("<verify>\nno\n</verify>", "search"), ("<VERIFY> no </VERIFY>", "answer"),  # not spliced: spaces stay
    (V.format("no") + V.format("yes"), "answer"),  # yes is tested first
    ("<verify>yes </verify><verify>no</verify>", "answer"),
])
def test_search_verdict(text, route):
    assert P.search_verdict(text) == route


@pytest.mark.parametrize("text,valid", [
    ("so \\boxed{2}", True), ("\\boxed{\\frac{1}{2}}", True), ("\\boxed{2", False), ("\\fbox{2}", False),
    ("\\boxed 5", False), ("no box", False), ("<think>\\boxed{1}</think> so 2", True),
    ("\\boxed{2} 二", True),  # no CJK rule for the solver
    ("\\boxed{5} \\boxed{", False), ("\\boxed{}", True),  # only the last \\boxed counts; an empty box is valid
])
def test_solver_validity(text, valid):
    assert P.valid("solver", text) is valid


@pytest.mark.parametrize("role,text,valid", [
    ("searcher", "<think>a</think><search>q</search>", True),
    ("searcher", "<search>q</search><think>a</think>", True),  # position relative to think not checked
    ("searcher", "</search>q<search><think>a</think>", True),  # its two tags in any order
    ("answerer", "<think>a</think><answer>x</answer>", True),
    ("searcher", "<think>a</think><answer>x</answer>", False),  # its own tags only
    ("answerer", "<think>a</think><search>x</search>", False),
    ("searcher", "<think>a</think>no tag", False),
    ("searcher", "<search>q</search>", False),  # no think
    ("searcher", "<think>a</think><think>b</think><search>q</search>", False),  # two thinks
    ("searcher", "</think><think><search>q</search>", False),  # wrong order
    ("answerer", "<think>a</think><answer>北京</answer>", False),  # CJK
])
def test_action_validity(role, text, valid):
    assert P.valid(role, text) is valid


def test_verify_validity_and_cjk():
    for role in ("math_verifier", "search_verifier"):
        assert P.valid(role, "<verify>anything</verify>") and not P.valid(role, "<verify>yes")
        assert P.valid(role, "</verify> x <verify>") and not P.valid(role, "<verify>yes</verify> 是")
    assert P.has_cjk("\u4e00") and P.has_cjk("\u9fff") and not P.has_cjk("\u3042 \uac00")  # kana/hangul are not


def test_has_cjk_equals_a_loop_over_the_characters():
    """The regex scan against the plain definition, on random strings drawn around both range ends."""
    import random

    rng = random.Random(0)
    near = [0x4E00 - 1, 0x4E00, 0x4E01, 0x9FFF - 1, 0x9FFF, 0xA000, 0x3042, 0xAC00, 0x3400, 0x20000, 0x41, 0x0A]
    for _ in range(2000):
        text = "".join(chr(rng.choice(near) if rng.random() < 0.1 else rng.randrange(0x20, 0x2FFFF))
                       for _ in range(rng.randrange(0, 40)))
        text = "".join(c for c in text if not 0xD800 <= ord(c) <= 0xDFFF)
        assert P.has_cjk(text) == any(0x4E00 <= ord(c) <= 0x9FFF for c in text), repr(text)


def test_observation_is_json_dumps_of_result():
    obs = P.observation(FakeRetriever().search(["q"], 2)[0] + [Hit("d3", "T3", "ends in spaces  ", 1.0)])
    assert obs.startswith('<information>{"result": "Doc 1: \\"Title \\"1\\"\\"\\ntext 1 caf\\u00e9')
    inner = json.loads(obs[len("<information>"):-len("</information>")])
    # every document stripped and followed by a newline, the last one too
    assert inner == {"result": 'Doc 1: "Title "1""\ntext 1 café\nline2\nDoc 2: "Title "2""\ntext 2 café\nline2\n'
                               'Doc 3: "T3"\nends in spaces\n'}
    assert P.observation([]) == '<information>{"result": ""}</information>'  # the server's [[]]
    assert P.observation(None) == '<information>{"result": "No search results found."}</information>'  # its []


# ------------------------------------------------------------------------------ math_refine


def test_math_reject_runs_second_round_with_team_context():
    b = FakeScriptedAgents(solver=["first \\boxed{3}", "second \\boxed{2}"], verifier=["wrong <verify>reject</verify>"])
    traj = run_wf("math_refine", MTASK, b)
    assert b.agents == ["solver", "verifier", "solver"]
    assert traj.final_answer == "second \\boxed{2}"
    assert [t.valid for t in traj.turns] == [True, True, True]
    # each agent sees the problem and every earlier output, as the reference writes the team context
    assert "What is 1+1?" in b.user(0) and "The output of" not in b.user(0)
    assert '\nThe output of "Solver Agent": first \\boxed{3}\n' in b.user(1)
    assert ('\nThe output of "Solver Agent": first \\boxed{3}\n\nThe output of "Verifier Agent": '
            'wrong <verify>reject</verify>\n') in b.user(2)
    # chat layout: the fixed system line, the whole role prompt as the user message
    for _, req in b.calls:
        assert [m["role"] for m in req.messages] == ["system", "user"]
        assert req.messages[0]["content"] == "You are a helpful and harmless assistant."
        assert (req.max_prompt_tokens, req.truncate) == (8192, "middle")


@pytest.mark.parametrize("verdict,calls", [
    ("<verify>approve</verify>", 2), ("<verify>Reject</verify>", 2), ("no tag", 2), ("<verify> reject </verify>", 3),
])
def test_math_verdicts_drive_the_loop(verdict, calls):
    b = FakeScriptedAgents(solver=["\\fbox{1}", "\\boxed{2}"], verifier=[verdict])
    traj = run_wf("math_refine", MTASK, b)
    assert len(traj.turns) == calls
    assert traj.turns[0].valid is False  # \fbox does not count
    assert traj.turns[1].valid is (verdict != "no tag")


# ------------------------------------------------------------------------------ search_route


def test_search_then_answer_and_what_each_agent_sees():
    b = FakeScriptedAgents(verifier=[V.format("no"), "ok <VERIFY>YES</VERIFY>"], searcher=[SEARCH.format("Hamlet author")],
                           answerer=[ANSWER.format(" William Shakespeare ") + "<answer>later</answer>"])
    r = FakeRetriever()
    traj = run_wf("search_route", TASK, b, retriever=r)
    assert b.agents == ["verifier", "searcher", "verifier", "answerer"]
    assert r.queries == ["Hamlet author"]
    assert traj.final_answer == "William Shakespeare"  # the answerer's first answer pair, stripped
    # the routing reads the lower-cased response; validity wants the tag pair as written
    assert [t.valid for t in traj.turns] == [True, True, False, True]
    # the searcher sees this step's verifier entry; the answerer does not
    assert '\nThe output of "Verifier Agent": <verify>no</verify>\n' in b.user(1) and "step 1 of 4" in b.user(1)
    assert "YES" not in b.user(3)
    # history: "Step 1:" + the action + " " + the observation, seen by the step-2 verifier and the answerer
    entry = "Step 1:<search>Hamlet author</search> <information>{\"result\": \"Doc 1:"
    assert entry in b.user(2) and entry in b.user(3)
    env = traj.extra["env"]
    assert (env["length"], env["reward"], env["won"], env["answer"]) == (2, 1.0, True, "William Shakespeare")
    assert [s["query"] for s in env["steps"]] == ["Hamlet author", None]
    assert "(no searches yet)" in b.user(0)
    for _, req in b.calls:
        assert (req.max_prompt_tokens, req.truncate) == (4096, "left") and len(req.messages) == 2


def test_no_at_the_last_step_ends_without_answer():
    b = FakeScriptedAgents(verifier=[V.format("no")] * 4, searcher=[SEARCH.format(f"q{i}") for i in range(3)],
                           answerer=[])
    r = FakeRetriever()
    traj = run_wf("search_route", TASK, b, retriever=r)
    assert b.agents == ["verifier", "searcher"] * 3 + ["verifier"]
    assert r.queries == ["q0", "q1", "q2"] and traj.final_answer is None
    assert "Step 3:<search>q2</search> <information>" in b.user(6)
    # the env still takes step 4, with an empty action: done, nothing to grade
    assert [(s["action"], s["done"]) for s in traj.extra["env"]["steps"]][-1] == ("", True)
    assert traj.extra["env"]["length"] == 4 and traj.extra["env"]["reward"] == 0.0


def test_old_last_step_behaviour_is_an_option():
    b = FakeScriptedAgents(verifier=[V.format("no")] * 4, searcher=[SEARCH.format("q")] * 3, answerer=[ANSWER.format("x")])
    traj = run_wf("search_route", TASK, b, retriever=FakeRetriever(), last_step="answer")
    assert b.agents[-1] == "answerer" and traj.final_answer == "x"


def test_untagged_action_is_an_empty_step_and_the_episode_goes_on():
    b = FakeScriptedAgents(verifier=["unparsable", V.format("yes")],
                           answerer=["Shakespeare, I think", ANSWER.format("Shakespeare")])
    r = FakeRetriever()
    traj = run_wf("search_route", TASK, b, retriever=r)
    assert b.agents == ["verifier", "answerer", "verifier", "answerer"]
    assert [t.valid for t in traj.turns] == [False, False, True, True]
    assert traj.final_answer == "Shakespeare" and r.queries == []
    assert "Step 1: \n" in b.user(2) and "step 2 of 4" in b.user(2)  # the empty step counts


def test_empty_query_is_still_sent():
    b = FakeScriptedAgents(verifier=[V.format("no"), V.format("yes")], searcher=["<think>t</think><search></search>"],
                           answerer=[ANSWER.format("a")])
    r = FakeRetriever()
    run_wf("search_route", TASK, b, retriever=r)
    assert r.queries == [""]
    assert "Step 1:<search></search> <information>" in b.user(2)


def test_a_searchers_answer_pair_alone_is_an_empty_step():
    b = FakeScriptedAgents(verifier=[V.format("no"), V.format("yes")], searcher=["<think>t</think><answer>Bard</answer>"],
                           answerer=[ANSWER.format("Shakespeare")])
    traj = run_wf("search_route", TASK, b, retriever=FakeRetriever())
    assert b.agents == ["verifier", "searcher", "verifier", "answerer"] and traj.turns[1].valid is False
    assert traj.final_answer == "Shakespeare" and "Step 1: \n" in b.user(2)


def test_answer_tags_inside_a_search_end_the_episode():
    """The env's done test is two substring tests on the action: a searcher's
    ``<search>q <answer>a</answer></search>`` ends the episode with the EM of "a"."""
    b = FakeScriptedAgents(verifier=[V.format("no")], searcher=["<think>t</think><search>q <answer>William Shakespeare</answer></search>"])
    r = FakeRetriever()
    traj = run_wf("search_route", TASK, b, retriever=r)
    assert traj.final_answer == "William Shakespeare" and len(traj.turns) == 2 and r.queries == []
    assert traj.extra["env"]["reward"] == 1.0


def test_reward_reads_the_last_answer_match_of_the_whole_episode():
    """An unclosed <answer> in a query opens a match that runs through the stored observation (kept
    as "\n" + obs + "\n") to the next </answer>: the reference grades that span, not the answer."""
    env = P.SearchEnv(["b"])
    assert env.act("<search>x <answer>a</search>").query == "x <answer>a"
    env.observe("<information>{}</information>")
    st = env.act("<answer>b</answer>")
    assert st.done and st.reward == 0.0
    assert env.answer == "a</search>\n<information>{}</information>\n<answer>b"
    env = P.SearchEnv(["b"])
    env.act("<search>x</search>")
    env.observe("<information>{}</information>")
    assert env.act("<answer> b </answer>").reward == 1.0 and env.answer == "b"
    env = P.SearchEnv(["b"], max_steps=1)
    st = env.act("<search>x</search>")
    assert st.done and st.query is None and env.answer is None and st.reward == 0.0  # the last step ends


def test_prompt_limit_options_reach_every_request():
    b = FakeScriptedAgents(verifier=[V.format("yes")], answerer=[ANSWER.format("x")])
    run_wf("search_route", TASK, b, retriever=FakeRetriever(), protocol=P.ProtocolOptions(0, None))
    assert all(req.max_prompt_tokens is None for _, req in b.calls)
    b = FakeScriptedAgents(solver=["\\boxed{1}"], verifier=[V.format("approve")])
    run_wf("math_refine", MTASK, b, protocol=P.ProtocolOptions(100, "right"))
    assert all((req.max_prompt_tokens, req.truncate) == (100, "right") for _, req in b.calls)


# ------------------------------------------------------------------------------ templates


def test_packaged_templates_and_partial_override(tmp_path):
    d = P.default_templates("search_route")
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump({"roles": {"answerer": "Q: {{question}}\n{{history}}\nAnswer in <answer></answer>."}}))
    t = P.load_templates("search_route", (str(f), str(f)))
    assert t.roles["answerer"].startswith("Q: ") and t.roles["verifier"] == d.roles["verifier"]
    assert t.sha256 != d.sha256 and t.source == str(f)
    assert P.load_templates("search_route", (d.to_dict(), "x")).sha256 == d.sha256
    b = FakeScriptedAgents(verifier=[V.format("yes")], answerer=[ANSWER.format("x")])
    run_wf("search_route", TASK, b, retriever=FakeRetriever(), prompts=t)
    assert b.user(1).startswith("Q: Who wrote Hamlet?\n(no searches yet)")


@pytest.mark.parametrize("roles,msg", [
    ({"answerer": "{{question}} {{history}} {{answer}}"}, "roles.answerer: unknown placeholder {{answer}}"),
    ({"searcher": "{{question}} {{history}}"}, "roles.searcher: missing placeholder {{team_context}}"),
    ({"solver": "{{question}}"}, "unknown role 'solver'"),
])
def test_bad_templates_name_file_role_and_placeholder(tmp_path, roles, msg):
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump({"roles": roles}))
    with pytest.raises(UserError) as e:
        P.load_templates("search_route", (str(f), str(f)))
    assert str(e.value).startswith(f"{f}: ") and msg in str(e.value) and "\n" not in str(e.value)


def test_literal_braces_need_no_escaping():
    assert P.render("put it in \\boxed{} for {{question}}", question="q") == "put it in \\boxed{} for q"


def test_team_file_prompts_and_protocol(tmp_path):
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({"system": "Sys.", "roles": {}}))
    team = tmp_path / "team.yaml"
    team.write_text(yaml.safe_dump({"worker_groups": {"g": "m"}, "agents": {"solver": "g", "verifier": "g"},
                                    "prompts": "p.yaml", "protocol": {"max_prompt_tokens": 512}}))
    spec = build_team("math_refine", ("solver", "verifier"), team_file=str(team))
    assert spec.prompts == {"system": "Sys.", "roles": {}} and spec.protocol == {"max_prompt_tokens": 512}
    # in a checkpoint folder a prompts path may not leave the folder
    ck = tmp_path / "ckpt"
    ck.mkdir()
    (ck / "team.yaml").write_text(team.read_text().replace("p.yaml", "../p.yaml"))
    with pytest.raises(UserError, match="outside the checkpoint folder"):
        build_team("math_refine", ("solver", "verifier"), model=str(ck))
    with pytest.raises(UserError, match=r"t: protocol\.truncate: must be 'left', 'middle' or 'right', got 'top'"):
        P.ProtocolOptions.from_dict({"truncate": "top"}, "t")


def test_search_questions_are_normalised():
    from drmas_bench.benchmarks.loaders import normalize_question
    from drmas_bench.benchmarks.loaders import qa_task as _qa_task

    assert normalize_question("  who is x ") == "who is x?" and normalize_question("who? ") == "who?"
    assert _qa_task({"question": "capital of france", "golden_answers": ["Paris"]}, 0, "nq").question == "capital of france?"


def test_checkpoint_team_yaml_records_prompts_protocol_and_retriever(tmp_path):
    from drmas_bench.agents.team import team_from_dict
    from drmas_retrieval import build_index
    from drmas_trainer.config.train import load_config
    from drmas_trainer.config.groups import plan_worker_groups
    from drmas_trainer.saving import checkpoint_team

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f'"T{i}"\ntext {i}'}) + "\n" for i in range(5)))
    build_index("bm25", corpus, tmp_path / "idx")
    spec = f"bm25:{tmp_path / 'idx'}"
    wf = get_workflow("search_route")
    cfg = load_config("tiny", {"workflow": "search_route", "retriever": spec})
    d = checkpoint_team(cfg, plan_worker_groups(cfg, wf.agents), wf, step=1)
    d = yaml.safe_load(yaml.safe_dump(d))  # what team.yaml holds
    assert d["protocol"] == {"max_prompt_tokens": 4096, "truncate": "left"}
    assert d["retriever"] == retriever_record(spec) and d["retriever"]["kind"] == "bm25"
    team = team_from_dict(d, wf.agents, "search_route", base_dir=tmp_path)
    assert P.load_templates("search_route", (team.prompts, "team.yaml")).sha256 == P.default_templates("search_route").sha256


def test_truncated_calls_are_counted_for_the_summary():
    from drmas_bench.api import protocol_summary

    b = FakeScriptedAgents(verifier=[V.format("no"), V.format("yes")], searcher=[SEARCH.format("TRUNCATE-ME")],
                           answerer=[ANSWER.format("x")])
    b.scripts["verifier"] = lambda req: V.format("yes") if "<information>" in req.messages[-1]["content"] else V.format("no")
    traj = run_wf("search_route", TASK, b, retriever=FakeRetriever())
    # the fake engine marks a call truncated when its prompt holds the marker: the step-2 calls
    assert [t.completion.prompt_truncated for t in traj.turns] == [False, False, True, True]
    s = protocol_summary([traj.to_dict()] * 2, {"prompts_sha256": "x"})
    assert s == {"prompts_sha256": "x", "calls": 8, "prompt_truncated_calls": 4, "prompt_limit_unenforced_calls": 0}
