"""Adding a suite is one folder: a throwaway suite in a temporary package (found through
``$DRMAS_SUITES``, nothing edited anywhere else) with a 3-agent ``plan -> act -> check`` loop, its
own format rules (tags, actions, verdicts, a figure of its own, its own word for actions), a
per-episode figure and an effects block with declared figures. A real evaluation with the real CLI
(tiny-random, a fresh interpreter) shows them, under its own words, in summary.json, summary.md, the
viewer page (in real headless Chromium), the leaderboard and compare; the real trainer trains it one
step with the tiny recipe's machinery. The suite imports only ``drmas_bench.suite``."""

from __future__ import annotations

import base64
import gzip
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "throwaway_tri_suite"

FILES = {
    "__init__.py": '''"""A throwaway suite: sums, planned, done and checked by three agents."""
''',
    "benchmarks.py": '''
from drmas_bench.suite import Benchmark, Suite, Task, register, register_suite

register_suite(Suite("tri", workflow="plan_act_check", max_new_tokens=12, family="tri"))


def sums():
    return [Task(f"tri-{i}", "tri_sums", f"What is {i} + {i + 1}?", [str(2 * i + 1)]) for i in range(6)]


register(Benchmark("tri_sums", "tri", "Throwaway sums", 6, to_task=lambda rec, i, name: None, generate=sums))
''',
    "grading.py": '''
from drmas_bench.suite import Family, register_family


def grade(pairs, timeout_s, math_grader):
    return [(bool(answer) and golds[0] in answer, {"tri_graded": True}) for answer, golds in pairs]


register_family("tri", Family(grade))
''',
    "plan_act_check.py": '''
from collections import Counter

from drmas_bench.suite import Effects, Episode, Figure, FormatRule, chat, format_rule, mean_or_none, workflow


def act_kind(text):
    return "tri-act-long" if len(text) > 20 else "tri-act-short"


def check_verdict(text):
    return "tri-pass" if len(text) % 2 else "tri-fail"


def checks_per_episode(recs):
    return {"tri_checks_per_episode": mean_or_none([len(r.agent_turns("checker")) for r in recs])}


def check_figures(texts):
    return {"verdicts": dict(Counter(map(check_verdict, texts))),
            "tri_reasoned_rejects": sum(check_verdict(t) == "tri-fail" and " " in t for t in texts)}


def tri_effects(recs):
    n = len(recs)
    return {"tri_episodes": n, "tri_rechecked_rate": sum(len(r.agent_turns("checker")) > 1 for r in recs) / n if n else None}


PLAN = format_rule(FormatRule("tri_plan", lambda t: [] if "<plan>" in t else ["tri_no_plan_tag"], ("tri_no_plan_tag",),
                              labels={"tri_no_plan_tag": "no plan tag"}))
ACT = format_rule(FormatRule("tri_act", lambda t: [], (), lambda t: (act_kind(t), None),
                             agent_figures=lambda texts: {"actions": dict(Counter(map(act_kind, texts)))},
                             labels={"actions": "tri moves"}))
CHECK = format_rule(FormatRule("tri_check", lambda t: [], (), lambda t: (None, check_verdict(t)),
                               agent_figures=check_figures, episode_figures=checks_per_episode,
                               labels={"tri_checks_per_episode": "tri checks per episode", "verdicts": "tri rulings",
                                       "tri_reasoned_rejects": "tri rejects with a reason"},
                               formats={"tri_reasoned_rejects": "count"}))
EFFECTS = Effects("tri", tri_effects,
                  figures=[Figure("tri_rechecked_rate", "tri checked twice", "share"),
                           Figure("tri_episodes", "tri episodes", "count")],
                  phrase="tri checked twice in {tri_rechecked_rate} of {tri_episodes}")


@workflow("plan_act_check", agents=("planner", "actor", "checker"), family="tri", title="plan-act-check",
          rules={"planner": PLAN, "actor": ACT, "checker": CHECK}, effects=EFFECTS)
async def plan_act_check(ep: Episode, rounds: int = 2) -> None:
    for r in range(rounds):
        plan = await ep.planner(chat("Plan in <plan></plan>.", ep.task.question))
        plan.valid = not PLAN.reasons(plan.completion.text)
        act = await ep.actor(chat("Do the plan.", plan.completion.text))
        ep.final_answer = act.completion.text
        check = await ep.checker(chat("Check the answer.", act.completion.text))
        if check_verdict(check.completion.text) == "tri-pass":
            break
''',
}


@pytest.fixture(scope="module")
def suite_env(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("pkgs")
    pkg = root / PACKAGE
    pkg.mkdir()
    for name, text in FILES.items():
        (pkg / name).write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["DRMAS_SUITES"] = PACKAGE
    return env


def _cli(env: dict[str, str], *args: str, cwd: Path) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-m", "drmas_bench", *args], env=env, cwd=cwd, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return p


@pytest.fixture(scope="module")
def run_dir(suite_env, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run") / "tri"
    _cli(suite_env, "-q", "eval", "--model", "tiny-random", "--suite", "tri", "--n", "2", "--max-new-tokens", "12",
         "--no-progress", "--out", str(out), cwd=out.parent)
    return out


@pytest.mark.slow  # a fresh interpreter loads the model and runs 12 episodes (about 15 s)
def test_the_suites_actions_verdicts_and_figure_reach_the_summaries(run_dir):
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["run"]["workflow"] == "plan_act_check" and s["micro"]["questions"] == 6
    agents = s["compliance"]["agents"]
    assert {a["rule"] for a in agents.values()} == {"tri_plan", "tri_act", "tri_check"}
    assert set(agents["actor"]["actions"]) <= {"tri-act-long", "tri-act-short"}
    assert sum(agents["actor"]["actions"].values()) == agents["actor"]["calls"]
    assert sum(agents["checker"]["verdicts"].values()) == agents["checker"]["calls"] > 0
    assert s["compliance"]["episodes"]["tri_checks_per_episode"] >= 1
    recs = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert all(r["extra"]["tri_graded"] for r in recs)  # graded by the suite's own family
    md = (run_dir / "summary.md").read_text()
    assert "plan-act-check workflow" in md and "tri checks per episode" in md
    assert any(v in md for v in agents["checker"]["verdicts"]) and any(a in md for a in agents["actor"]["actions"])
    # its own figures and effects, each under the words it declares (its "actions" word over the built-in one)
    assert s["compliance"]["labels"]["actions"] == "tri moves" and agents["checker"]["tri_reasoned_rejects"] >= 0
    assert s["effects"]["labels"] == {"tri_rechecked_rate": "tri checked twice (%)", "tri_episodes": "tri episodes"}
    assert s["effects"]["tri"]["tri_episodes"] == 12
    for words in ("tri moves: ", "tri rulings: ", "tri rejects with a reason: ", "| tri checked twice (%) ",
                  "| tri episodes "):
        assert words in md, words


@pytest.mark.slow
def test_the_suites_effects_reach_the_leaderboard_and_compare(run_dir, suite_env, tmp_path):
    board = _cli(suite_env, "leaderboard", str(run_dir), "--no-paper", cwd=tmp_path).stdout
    s = json.loads((run_dir / "summary.json").read_text())["effects"]["tri"]
    assert f"tri checked twice in {100 * s['tri_rechecked_rate']:.0f}% of 12" in board
    cmp = _cli(suite_env, "compare", str(run_dir), str(run_dir), cwd=tmp_path).stdout
    assert "| tri checked twice (%) " in cmp and "| tri episodes " in cmp


@pytest.mark.slow
def test_the_suites_parse_shows_in_the_viewer_page(run_dir, suite_env, tmp_path):
    """The page `drmas-bench view` writes holds the report (caption, the per-episode figure) and,
    per turn, what the suite's rules parsed; in real headless Chromium the page draws both."""
    import importlib.util

    page = tmp_path / "tri.html"
    _cli(suite_env, "view", str(run_dir), "--out", str(page), cwd=tmp_path)
    html = page.read_text(encoding="utf-8")
    assert "plan-act-check" in html and "tri checks per episode" in html
    assert all(w in html for w in ("tri moves: ", "tri rulings: ", "tri rejects with a reason: ", "tri checked twice (%)"))
    chunks = re.findall(r'<script type="text/plain" id="chunk-[^"]*">([^<]*)</script>', html)
    turns = [t for c in chunks for d in json.loads(gzip.decompress(base64.b64decode(c))) for t in d["turns"]]
    assert {t["action"] for t in turns if t["agent"] == "actor"} <= {"tri-act-long", "tri-act-short"}
    assert {t["verdict"] for t in turns if t["agent"] == "checker"} <= {"tri-pass", "tri-fail"}
    assert any(t["verdict"] for t in turns) and all(t["reasons"] == ["tri_no_plan_tag"] for t in turns
                                                    if t["agent"] == "planner" and "<plan>" not in t["response"])

    spec = importlib.util.spec_from_file_location("bench_view", ROOT / "scripts" / "bench_view.py")
    bench_view = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_view)
    if bench_view.browser() is None:
        pytest.skip("no headless Chromium (Debian: apt-get install -y chromium)")
    res = bench_view.open_page(page, "open=0")
    assert res["errors"] == [] and res["shown"] == 12 and res["turns"] > 0
    dom = res["dom"]
    assert "plan-act-check" in dom and "tri checks per episode" in dom  # the report's caption and figure
    assert ("tri-act-long" in dom or "tri-act-short" in dom) and ("tri-pass" in dom or "tri-fail" in dom)


@pytest.mark.slow  # a fresh interpreter, the real trainer: one RL step on the suite's own tasks (about 20 s)
def test_the_suite_trains_one_step_with_the_tiny_recipe(suite_env, tmp_path):
    out = tmp_path / "train"
    _cli(suite_env, "train", "--recipe", "tiny", "--steps", "1", "--out", str(out),
         "--set", "workflow=plan_act_check", "--set", "data.source=benchmark:tri_sums", "--set", "sft.steps=0",
         "--set", "sft.agent_steps={}", "--set", "rollout.prompts_per_step=2", "--set", "rollout.n=2",
         "--set", "algo.mini_batches=1", "--set", "val.before_train=false", "--set", "val.every=0", cwd=tmp_path)
    (rec,) = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert rec["step"] == 1 and {"planner", "actor", "checker"} <= {k.split("/")[1] for k in rec if k.startswith("agent/")}
    assert (out / "ckpt" / "latest").exists()
