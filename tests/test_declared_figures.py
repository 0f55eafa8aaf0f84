"""Declared, then rendered: every workflow in the registry (the list `workflow_names` gives, not a
hand list) runs a few scripted episodes and goes through summary.json, summary.md, the viewer page,
the leaderboard, ``compare`` and ``sweep``; each figure its effects block and its agents' format rules
declare appears there under its declared words, and no report branches on a workflow's name.

What each check expects is read off the declarations (`declared`: the workflow's `Effects` and
`Figure`s, its rules' ``reason_names`` and ``labels``), never off the summary under test, so a summary
or a report that drops a declared figure fails; the leaderboard's phrase is the declared phrase filled
here with the block's values, written as `figures.FORMATS` says, not by the code that writes it.

The episodes are the workflows' own code over a scripted engine (`ScriptedBackend`, a fake: replies
cycle through texts in every shipped format and in each way a shipped rule says a reply breaks
one) and a fake retriever; they are graded by the workflow's real grading family. 19 episodes: with
19 replies and each episode's script starting 7 replies after the last one's, an episode's n-th call
meets every reply over the 19."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from html import unescape
from pathlib import Path
from typing import Any

import pytest

from drmas_bench import metrics
from drmas_bench.figures import Effects, Figure, as_effects
from drmas_bench.report.compare import compare_runs
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

# replies in every shipped format (tags, boxes, verdicts, critiques, actions), some in none, and some
# that break a format in each way a shipped rule declares (so every declared reason is counted)
REPLIES = ["<think>t</think><search>who</search>", "<think>t</think>\n<answer>3</answer>", "<verify>yes</verify>",
           "<verify>no</verify>", "<think>a</think><verify>approve</verify>", "<verify>reject</verify>", "\\boxed{3}",
           "so \\boxed{4}", "<answer>3</answer>", "<answer>5</answer>", "<verdict>approve</verdict>",
           "<verdict>reject</verdict>", "<critique>right</critique>", "<critique>wrong</critique>", "plain text", "",
           # and the replies that give the rarer reasons rules declare: an unclosed box, CJK text, </think> before <think>
           "\\boxed{3", "<verify>yes</verify> 对", "</think>t<think><answer>3</answer>"]


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


def scripted_records(name: str, episodes: int = 19, offset: int = 0) -> list[dict[str, Any]]:
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


@dataclass
class Declared:
    """What a workflow declares, read off its declarations (never off a summary): its effects block's
    key and figures ({key: words}, in order, and {key: format}), the reasons its agents' format rules
    can give ({reason: words}, from their ``reason_names``), the figures those rules read ({key: words},
    their other labels), and which agents' rules read figures off each reply (``agent_figures``)."""

    effects_key: str | None
    effects: dict[str, str]
    formats: dict[str, str]
    phrase: str
    reasons: dict[str, str]
    figures: dict[str, str]
    readers: dict[str, set[str]]


def declared(workflow: str) -> Declared:
    spec = get_workflow(workflow)
    words: dict[str, str] = {}
    reason_names: list[str] = []
    readers: dict[str, set[str]] = {}
    for agent, rule in spec.rules.items():
        reason_names += [r for r in rule.reason_names if r not in reason_names]
        for key, w in rule.labels.items():
            words.setdefault(key, Figure(key, w, rule.formats.get(key, "auto")).words)
    for agent, rule in spec.rules.items():
        if rule.agent_figures is not None:
            readers[agent] = {k for k in rule.labels if k not in reason_names}
    eff = spec.effects
    return Declared(eff.key if eff else None, {f.key: f.words for f in eff.figures} if eff else {},
                    {f.key: f.format for f in eff.figures} if eff else {}, eff.phrase if eff else "",
                    {r: words[r] for r in reason_names}, {k: w for k, w in words.items() if k not in reason_names},
                    readers)


def dig(block: dict[str, Any], key: str) -> tuple[bool, Any]:
    """(found, value) of a dotted key in a nested dict."""
    for part in key.split("."):
        if not isinstance(block, dict) or part not in block:
            return False, None
        block = block[part]
    return True, block


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
    d = declared("math_4agent")  # its declaration: 8 rule labels, 5 reasons and 3 figures
    assert len(d.reasons) + len(d.figures) == 8 and set(d.figures) == {"rounds_per_episode", "approve_rate", "verdicts"}
    assert all(declared(n).reasons for n in runs)  # every workflow declares something its reports must show


def test_summary_json_holds_every_declared_figure(runs):
    for name, (_, _, s) in runs.items():
        d = declared(name)
        c = s["compliance"]
        assert {k: c["labels"].get(k) for k in {**d.reasons, **d.figures}} == {**d.reasons, **d.figures}, name
        counted = {r for e in c["agents"].values() for r in e["invalid_reasons"]}
        assert set(d.reasons) <= counted, (name, set(d.reasons) - counted)  # the script reaches every reason
        for key in d.figures:  # a rule's figure: in the entry of an agent whose rule reads it, or per episode
            where = [a for a, keys in d.readers.items() if key in keys and key in c["agents"].get(a, {})]
            assert where or key in c["episodes"], (name, key)
        for agent, keys in d.readers.items():  # an agent whose rule reads figures has them in its entry
            assert keys & set(c["agents"][agent]), (name, agent)
        if d.effects_key is None:
            assert "labels" not in s["effects"], name
            continue
        assert list(s["effects"]["labels"])[:len(d.effects)] == list(d.effects), name  # declared order
        assert {k: s["effects"]["labels"][k] for k in d.effects} == d.effects, name
        block = s["effects"][d.effects_key]
        missing = [k for k in d.effects if not dig(block, k)[0]]
        assert not missing, (name, missing)  # a summary that drops a declared figure fails here


def _md_section(md: str, heading: str) -> str:
    return md.split(heading, 1)[1].split("\n### ", 1)[0] if heading in md else ""


def _first_cells(text: str) -> set[str]:
    return {line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| ")}


def test_summary_md_shows_every_declared_figure_under_its_words(runs):
    for name, (_, _, s) in runs.items():
        d = declared(name)
        md = run_summary_markdown(s)
        effects = _md_section(md, "agents did to the score")
        missing = {md_label("", {"": w}) for w in d.effects.values()} - _first_cells(effects)
        assert not missing, (name, missing)  # a row each
        compliance = _md_section(md, "### Why: protocol compliance")
        for words in d.figures.values():
            assert f"{md_label('', {'': words})}: " in compliance, (name, words)
        for words in d.reasons.values():  # "why invalid": each reason's words, then its count
            assert re.search(rf"{re.escape(md_label('', {'': words}))} \d", compliance), (name, words)
        assert not re.search(r"\{[a-z_.]+\}", md), name  # a declared note's figures are filled in


def _html_table(html: str, name: str) -> str:
    m = re.search(rf'<table class="report" data-table="{name}">(.*?)</table>', html)
    return m.group(1) if m else ""


def test_the_viewer_page_shows_every_declared_figure(runs):
    for name, (a, _, _) in runs.items():
        d = declared(name)
        page = render([a])
        if d.effects_key is not None:
            rows = re.findall(r'<th data-label="figure">(.*?)</th>', _html_table(page, f"effects-{d.effects_key}"))
            assert [unescape(r) for r in rows][:len(d.effects)] == list(d.effects.values()), name  # declared order
        agents = unescape(_html_table(page, "compliance"))
        episodes = unescape(_html_table(page, "episodes"))
        for words in d.figures.values():
            assert f"{words}: " in agents or f">{words}<" in episodes, (name, words)
        for words in d.reasons.values():
            assert re.search(rf"{re.escape(words)}: \d", agents), (name, words)


def written(words: str, fmt: str, x: Any) -> str:
    """A figure's value in a phrase as figures.py's FORMATS say: a share in whole %, points with a
    sign, a count as it is, a real number with two decimals, "–" for none."""
    if x is None:
        return "–"
    if fmt == "points" or words.endswith("(pts)"):
        return f"{100 * x:+.1f} pts"
    if fmt == "share" or words.endswith("(%)"):
        return f"{100 * x:.0f}%"
    assert not isinstance(x, dict), "a counts figure in a phrase: write it here"
    return str(x) if isinstance(x, int) else f"{x:.2f}"


def phrase_of(d: Declared, block: dict[str, Any]) -> str:
    """The declared phrase filled with the block's values: a [part] only when every figure it names
    is there and not 0, each {key} its value written as its declared format says."""
    def value(key: str) -> Any:
        return dig(block, key)[1]

    def part(m: re.Match) -> str:
        named = re.findall(r"\{([^{}]+)\}", m.group(1))
        return m.group(1) if all(value(k) not in (None, 0) for k in named) else ""

    text = re.sub(r"\[([^\[\]]*\{[^{}]+\}[^\[\]]*)\]", part, d.phrase)
    return re.sub(r"\{([^{}]+)\}", lambda m: written(d.effects[m.group(1)], d.formats[m.group(1)], value(m.group(1))), text)


def test_leaderboard_compare_and_sweep_show_the_declared_effects(runs):
    for name, (a, b, s) in runs.items():
        d = declared(name)
        spec = get_workflow(name)
        (table,) = build_leaderboard([a, b], parse_metrics("avg@n"))
        md = table_markdown(table)
        phrase = digest(a).effect
        if d.effects_key is None:
            assert phrase == "–"
        else:
            assert d.phrase, f"{name}: a shipped workflow declares its phrase"
            assert phrase == phrase_of(d, s["effects"][d.effects_key]) and phrase in md, (name, phrase)
        cmp_md = compare_markdown(compare_runs(a, b, n_boot=20))
        if d.effects_key is not None:
            section = cmp_md.split("agents did to the score")[1].split("## Flipped")[0]
            for words in d.effects.values():
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
