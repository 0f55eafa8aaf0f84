"""Declared, then rendered: every workflow in the registry (the list `workflow_names` gives, not a
hand list) runs a few scripted episodes and goes through summary.json, summary.md, the viewer page,
the leaderboard, ``compare`` and ``sweep``; each figure its effects block and its agents' format rules
declare appears there under its declared words, and no report branches on a workflow's name.

The episodes are the workflows' own code over a scripted engine (`ScriptedBackend`, a fake: replies
cycle through texts in every shipped format) and a fake retriever; they are graded by the
workflow's real grading family."""

from __future__ import annotations

import asyncio
import json
import re
from html import unescape
from pathlib import Path
from typing import Any

import pytest

from drmas_bench import metrics
from drmas_bench.figures import OPTIONAL, PLACEHOLDER, Effects, Figure, as_effects, lookup, shown_keys
from drmas_bench.report.compare import compare_runs
from drmas_bench.report.labels import rule_figure_keys
from drmas_bench.report.leaderboard import build_leaderboard, digest, effect_phrase
from drmas_bench.report.markdown import (
    compare_markdown,
    effects_markdown,
    md_label,
    sweep_markdown,
    table_markdown,
)
from drmas_bench.report.run_markdown import run_summary_markdown
from drmas_bench.report.runs import Run
from drmas_bench.report.tables import parse_metrics
from drmas_bench.report.view import render
from drmas_bench.runner import grade_trajectories
from drmas_bench.sweep import assignment_figures, sweep_document
from drmas_bench.sweep_design import Design
from drmas_bench.types import Completion, Sampling, Task
from drmas_bench.workflows import get_workflow, workflow_names
from drmas_bench.workflows.base import Episode

# replies in every shipped format (tags, boxes, verdicts, critiques, actions), and some in none
REPLIES = ["<think>t</think><search>who</search>", "<think>t</think>\n<answer>3</answer>", "<verify>yes</verify>",
           "<verify>no</verify>", "<think>a</think><verify>approve</verify>", "<verify>reject</verify>", "\\boxed{3}",
           "so \\boxed{4}", "<answer>3</answer>", "<answer>5</answer>", "<verdict>approve</verdict>",
           "<verdict>reject</verdict>", "<critique>right</critique>", "<critique>wrong</critique>", "plain text", ""]


class ScriptedBackend:
    """A fake team runtime: every agent's reply is the next text of `REPLIES` (offset by the episode's
    sample), so a few episodes take every branch a workflow has."""

    def __init__(self, offset: int) -> None:
        self.i = offset

    def worker_group(self, agent: str) -> str:
        return agent

    def sampling(self, agent: str) -> Sampling:
        return Sampling(max_new_tokens=16)

    async def generate(self, agent: str, request: Any) -> Completion:
        self.i += 1
        text = REPLIES[self.i % len(REPLIES)]
        return Completion(text, prompt_tokens=10, completion_tokens=len(text.split()), latency_s=0.01 * (self.i % 5))


class FakeRetriever:
    """A fake retriever: one passage per query, holding the gold answer every other time."""

    def __init__(self) -> None:
        self.calls = 0

    def search(self, queries: list[str], topk: int) -> list[list[dict[str, str]]]:
        self.calls += 1
        return [[{"id": "1", "title": "Doc", "text": "three is 3" if self.calls % 2 else "nothing"}] for _ in queries]


def scripted_records(name: str, episodes: int = 6, offset: int = 0) -> list[dict[str, Any]]:
    """``episodes`` episodes of workflow ``name`` over two questions, graded by its family."""
    spec = get_workflow(name)
    tasks = [Task(f"q{i}", "scripted", f"What is {i} + {3 - i}?", ["3"]) for i in range(2)]

    async def one(k: int):
        ep = Episode(tasks[k % 2], k // 2, ScriptedBackend(offset + 7 * k), spec.agents, seed=1, retriever=FakeRetriever())
        await spec.fn(ep)
        return ep.finish()

    async def every():
        return [await one(k) for k in range(episodes)]

    trajs = asyncio.run(every())
    grade_trajectories(trajs, spec.family, round1_answer=spec.round1_answer)
    return [json.loads(json.dumps(t.to_dict())) for t in trajs]


def as_run(name: str, workflow: str, records: list[dict[str, Any]]) -> Run:
    """A run read back, held in memory (what `report.runs.load_run` gives for a run directory)."""
    spec = get_workflow(workflow)
    team = {"agents": {a: {"worker_group": a, "model": "scripted"} for a in spec.agents}}
    return Run(path=Path(name), name=name, config={"suite": "scripted", "workflow": workflow, "n": 3}, records=records,
               suite="scripted", workflow=workflow, n=3, benchmarks=["scripted"], team=team,
               sampling={a: {"max_new_tokens": 16} for a in spec.agents}, seed=1)


def declared_words(workflow: str) -> dict[str, str]:
    """Every figure's words the workflow declares: its effects block's and its rules' figures."""
    spec = get_workflow(workflow)
    return {**spec.rule_labels(), **spec.effect_labels()}


@pytest.fixture(scope="module")
def runs() -> dict[str, tuple[Run, Run, dict[str, Any]]]:
    out = {}
    for name in workflow_names():  # the registry, whatever suites it holds
        a, b = scripted_records(name), scripted_records(name, offset=3)
        summary = json.loads(json.dumps(metrics.summarize(a, n_boot=20, workflow=name)))  # as summary.json holds it
        out[name] = (as_run(f"{name}-a", name, a), as_run(f"{name}-b", name, b), summary)
    return out


def test_the_registry_holds_the_shipped_teams(runs):
    assert {"math_4agent", "toy_fixer", "math_refine", "search_route"} <= set(runs)


def test_summary_json_stores_the_declared_labels(runs):
    for name, (_, _, s) in runs.items():
        spec = get_workflow(name)
        assert s["compliance"]["labels"] == spec.rule_labels(), name
        if spec.effects is None:
            assert "labels" not in s["effects"]
            continue
        assert list(s["effects"]["labels"]) == [f.key for f in spec.effects.figures] + [
            k for k in spec.labels if k not in s["effects"]["labels"]]
        block = s["effects"][spec.effects.key]
        # a shipped workflow names every figure of its block (none is shown in words made from its key)
        assert shown_keys([block], s["effects"]["labels"]) == [k for k in s["effects"]["labels"] if lookup(block, k)[0]]


def declared_in(name: str, s: dict[str, Any]) -> dict[str, list[str]]:
    """The words of every declared figure this run's summary holds, by the section that shows it:
    ``effects`` (its effects block's figures), ``agents`` (figures its agents' rules read off their
    replies), ``episodes`` (its rules' per-episode figures)."""
    spec = get_workflow(name)
    rules = spec.rule_labels()
    out: dict[str, list[str]] = {"effects": [], "agents": [], "episodes": []}
    if spec.effects is not None:
        block = s["effects"][spec.effects.key]
        out["effects"] = [w for k, w in spec.effect_labels().items() if lookup(block, k)[0]]
    for entry in s["compliance"]["agents"].values():
        out["agents"] += [rules[k] for k in rule_figure_keys(entry)]  # a rule's figure is a declared one
    out["episodes"] = [rules[k] for k in s["compliance"]["episodes"] if k != "episodes"]
    return out


def _md_section(md: str, heading: str) -> str:
    return md.split(heading, 1)[1].split("\n### ", 1)[0] if heading in md else ""


def _first_cells(text: str) -> set[str]:
    return {line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| ")}


def test_summary_md_shows_every_declared_figure_under_its_words(runs):
    for name, (_, _, s) in runs.items():
        md = run_summary_markdown(s)
        shown = declared_in(name, s)
        effects = _md_section(md, "agents did to the score")
        assert {md_label("", {"": w}) for w in shown["effects"]} <= _first_cells(effects), name  # a row each
        compliance = _md_section(md, "### Why: protocol compliance")
        for words in shown["agents"] + shown["episodes"]:
            assert f"{md_label('', {'': words})}: " in compliance, (name, words)
        assert not re.search(r"\{[a-z_.]+\}", md), name  # a declared note's figures are filled in


def _html_table(html: str, name: str) -> str:
    m = re.search(rf'<table class="report" data-table="{name}">(.*?)</table>', html)
    return m.group(1) if m else ""


def test_the_viewer_page_shows_every_declared_figure(runs):
    for name, (a, _, s) in runs.items():
        page = render([a])
        shown = declared_in(name, s)
        spec = get_workflow(name)
        if spec.effects is not None:
            rows = re.findall(r'<th data-label="figure">(.*?)</th>', _html_table(page, f"effects-{spec.effects.key}"))
            assert [unescape(r) for r in rows][:len(shown["effects"])] == shown["effects"], name  # declared order
        agents = unescape(_html_table(page, "compliance"))
        assert all(f"{w}: " in agents for w in shown["agents"]), name
        episodes = unescape(_html_table(page, "episodes"))
        assert all(f">{w}<" in episodes for w in shown["episodes"]), name


def test_leaderboard_compare_and_sweep_show_the_declared_effects(runs):
    for name, (a, b, s) in runs.items():
        spec = get_workflow(name)
        (table,) = build_leaderboard([a, b], parse_metrics("avg@n"))
        md = table_markdown(table)
        phrase = digest(a).effect
        if spec.effects is None:
            assert phrase == "–"
        else:
            assert phrase == effect_phrase(spec.effects, s["effects"][spec.effects.key]) and "{" not in phrase
            literal = [p for p in PLACEHOLDER.split(OPTIONAL.sub("", spec.effects.phrase))[::2] if p.strip()]
            if not spec.effects.phrase:  # none declared: its first figure, labelled
                literal = [next(iter(spec.effect_labels().values()), "–")]
            assert all(p in phrase for p in literal) and phrase != "–", (name, phrase)  # the declared words, filled
            assert phrase in md
        cmp_md = compare_markdown(compare_runs(a, b, n_boot=20))
        if spec.effects is not None:
            section = cmp_md.split("agents did to the score")[1].split("## Flipped")[0]
            for words in s["effects"]["labels"].values():
                assert md_label("", {"": words}) in section, (name, words)
        design = Design(name, spec.agents, "scripted", {}, "listed", [{x: "scripted" for x in spec.agents}],
                        {x: "scripted" for x in spec.agents}, 1)
        row = {"assignment": design.baseline, "run": a.name, **assignment_figures(a)}
        sweep_md = sweep_markdown(sweep_document(design, [row], [a], suite="scripted", prices=None, cache=None, n_boot=20))
        assert "agents' effect" in sweep_md and phrase.replace("|", "/") in sweep_md


def test_a_declaration_is_checked_where_it_is_made():
    fn = metrics.summarize
    with pytest.raises(ValueError, match="format 'percent'"):
        Figure("x", "x", "percent")
    with pytest.raises(ValueError, match="says share"):
        Figure("x", "x (%)", "count")
    assert Figure("x", "x", "share").words == "x (%)" and Figure("d", "d", "points").words == "d (pts)"
    with pytest.raises(ValueError, match="phrase names y"):
        as_effects(Effects("k", fn, (Figure("x", "x"),), phrase="{y}"))
    with pytest.raises(ValueError, match="must be a name other than"):
        as_effects(("labels", fn))
    assert as_effects(Effects("k", fn, {"x": "an x"})).figures == (Figure("x", "an x"),)  # type: ignore[arg-type]


def test_a_bare_effects_pair_is_still_shown():
    """A workflow that declares only ``(key, fn)``: its block is shown in words made from its keys, and
    its leaderboard phrase is its first three figures, labelled."""
    bare = as_effects(("k", lambda records: {}))
    block = {"episodes": 4, "hit_rate": 0.5, "misses": 2, "spread": 1.25}
    assert effect_phrase(bare, block) == "hit rate 50%; misses 2; spread 1.25"
    md = "\n".join(effects_markdown({"workflow": None, "k": block}))
    assert {"episodes", "hit rate", "misses", "spread"} <= _first_cells(md) and "| 50.0 " in md
