"""A workflow is one module: one defined here, with its format rules and its effects, gets compliance,
effects and the viewer's per-turn reasons from the harness with no edit anywhere else."""

from __future__ import annotations

import asyncio
import random

import pytest

from drmas_bench import metrics
from drmas_bench.records import RecordView, views
from drmas_bench.report.view import turns_view
from drmas_bench.types import Completion, Sampling, Task
from drmas_bench.workflows import WORKFLOWS, get_workflow
from drmas_bench.workflows.base import Episode, workflow


def shout_rule(text: str) -> list[str]:
    """The caller's rule: a response must be upper case and end with '!'."""
    out = []
    if text != text.upper():
        out.append("not_upper")
    if not text.endswith("!"):
        out.append("no_bang")
    return out


def echo_effects(records: list[RecordView]) -> dict:
    """How often the echoer repeated the caller's last word (the records come as typed views)."""
    hits = 0
    for r in records:
        said = [t.text for t in r.turns]
        hits += len(said) == 2 and said[1].lower().startswith(said[0].rstrip("!").split()[-1].lower())
    return {"episodes": len(records), "echo_rate": hits / len(records) if records else None}


@pytest.fixture(scope="module")
def shout_echo():
    get_workflow("toy")  # the suites are discovered (the registry freezes): this test's entry is its own
    with WORKFLOWS.unfrozen():
        @workflow("test_shout_echo", agents=("caller", "echoer"), family="toy",
                  rules={"caller": shout_rule}, effects=("echo", echo_effects))
        async def shout_echo(ep: Episode) -> None:
            first = await ep.caller([{"role": "user", "content": ep.task.question}])
            first.valid = not shout_rule(first.completion.text)
            second = await ep.echoer([{"role": "user", "content": first.completion.text}])
            ep.final_answer = second.completion.text

    yield get_workflow("test_shout_echo")
    with WORKFLOWS.unfrozen():
        del WORKFLOWS["test_shout_echo"]


class FakeBackend:
    """A fake: each agent answers from its own list of texts, chosen at random."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def worker_group(self, agent: str) -> str:
        return "shared"

    def sampling(self, agent: str) -> Sampling:
        return Sampling(max_new_tokens=8)

    async def generate(self, agent: str, request) -> Completion:
        texts = {"caller": ["HELLO THERE!", "hello there!", "HELLO THERE", "quiet"],
                 "echoer": ["there", "nope", "THERE again"]}[agent]
        return Completion(self.rng.choice(texts), prompt_tokens=3, completion_tokens=2, latency_s=0.1, finish="stop")


def run_episodes(spec, n: int, seed: int) -> list[dict]:
    backend = FakeBackend(seed)

    async def one(i: int) -> dict:
        ep = Episode(Task(id=str(i), benchmark="toy", question="say hi", answers=["hi"]), 0, backend, spec.agents)
        await spec.fn(ep)
        return ep.finish().to_dict()

    async def all_() -> list[dict]:
        return [await one(i) for i in range(n)]

    return asyncio.run(all_())


def test_a_workflow_defined_here_gets_compliance_effects_and_viewer_reasons(shout_echo):
    recs = run_episodes(shout_echo, 40, seed=3)
    texts = [r["turns"][0]["completion"]["text"] for r in recs]
    comp = metrics.compliance(recs, workflow="test_shout_echo")
    caller = comp["agents"]["caller"]
    assert caller["rule"] == "shout_rule"
    assert caller["calls"] == 40
    assert caller["valid_by_rules"] == sum(not shout_rule(t) for t in texts)
    assert caller["valid"] == caller["valid_by_rules"]
    assert caller["invalid_reasons"] == {k: v for k in ("not_upper", "no_bang")
                                         if (v := sum(k in shout_rule(t) for t in texts))}
    assert comp["agents"]["echoer"]["rule"] is None and comp["agents"]["echoer"]["valid_by_rules"] is None

    eff = metrics.effects(recs, workflow="test_shout_echo")
    assert eff["echo"] == echo_effects(views(recs))
    assert eff["benchmarks"] == {"toy": {"echo": echo_effects(views(recs))}}
    assert set(eff["agents"]) == {"caller", "echoer"}

    view = turns_view(recs[0], "test_shout_echo")
    assert view[0]["reasons"] == shout_rule(texts[0])
    assert view[1]["reasons"] == []


def test_records_name_the_workflow_they_came_from(shout_echo):
    recs = run_episodes(shout_echo, 3, seed=0)
    assert metrics.infer_workflow(recs) == "test_shout_echo"
    assert metrics.compliance(recs)["workflow"] == "test_shout_echo"


# ------------------------------------------------------------------ a suite is one module too


@pytest.fixture(scope="module")
def echo_suite(shout_echo):
    """A suite declared here, as a tasks/<suite>.py module would: its default workflow (the one above),
    its generation limit and its grading family, and one built-in benchmark."""
    from drmas_bench.benchmarks.base import BENCHMARKS, Benchmark, register
    from drmas_bench.suites.registry import SUITES, Suite, register_suite

    with SUITES.unfrozen(), BENCHMARKS.unfrozen():
        suite = register_suite(Suite("test_echo_suite", workflow="test_shout_echo", max_new_tokens=7, family="toy"))
        bench = register(Benchmark(
            "test_echo_bench", "test_echo_suite", "Echo (a test suite)", 3, to_task=lambda rec, i, b: Task.from_dict(rec),
            generate=lambda: [Task(id=str(i), benchmark="test_echo_bench", question="say hi", answers=["3"]) for i in range(3)]))
    yield suite, bench
    with SUITES.unfrozen(), BENCHMARKS.unfrozen():
        del BENCHMARKS["test_echo_bench"], SUITES["test_echo_suite"]


def test_a_suite_defined_here_picks_its_workflow_token_limit_and_grading(echo_suite):
    from drmas_bench.plan import EvalConfig, choices, resolve
    from drmas_bench.provenance import grader_record
    from drmas_bench.runner import grade_trajectories
    from drmas_bench.suites.registry import suite_names
    from drmas_bench.types import Trajectory, UserError

    suite, bench = echo_suite
    assert bench.family == "toy"  # the suite's family, not named by the benchmark
    assert "test_echo_suite" in suite_names() and "test_echo_suite" in choices()["suite"]
    r = resolve(EvalConfig(model="tiny-random", suite="test_echo_suite"))
    assert r.suite == "test_echo_suite" and [b.name for b in r.benches] == ["test_echo_bench"]
    assert r.wf.name == "test_shout_echo" and r.sampling.max_new_tokens == 7
    assert set(r.team.agents) == {"caller", "echoer"}

    trajs = [Trajectory(task=t, sample_idx=0, final_answer=a)
             for t, a in zip(bench.generate(), ["3", "4", None])]
    grade_trajectories(trajs, "math")  # by the benchmark's family (toy), not the fallback
    assert [t.correct for t in trajs] == [True, False, False]
    with pytest.raises(UserError, match="--grader"):
        grader_record(bench.family, "careful")  # the toy family takes no --grader
    assert grader_record(bench.family, None) == {"family": "toy"}


def test_a_workflow_names_its_grading_family_once():
    """``family=`` names the grading family; ``grader=`` is taken as the same for workflow modules that
    spell it so; neither or both is an error (a math grader is chosen per run, with --grader)."""
    async def episode(ep: Episode) -> None:
        ep.final_answer = "x"

    get_workflow("toy")  # the suites are discovered (the registry freezes)
    with pytest.raises(ValueError, match="registry is frozen"):
        workflow("test_family_spelled_grader", agents=("a",), grader="qa")(episode)
    with WORKFLOWS.unfrozen():
        try:
            workflow("test_family_spelled_grader", agents=("a",), grader="qa")(episode)
            assert get_workflow("test_family_spelled_grader").family == "qa"
        finally:
            WORKFLOWS.unregister("test_family_spelled_grader")
    with pytest.raises(ValueError, match="name its grading family once"):
        workflow("test_family_twice", agents=("a",), family="qa", grader="qa")
    with pytest.raises(ValueError, match="name its grading family once"):
        workflow("test_family_none", agents=("a",))
