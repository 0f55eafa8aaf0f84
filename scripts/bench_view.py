"""How big the run viewer's page is and how fast it first paints on a large run.

    python scripts/bench_view.py                       # a scripted search_route run, repeated to 10,000
    python scripts/bench_view.py --run runs/NAME --total 10000 --keep bench-view/

Builds a synthetic run directory of `--total` trajectories from real records repeated (those of
`--run`, else of a scripted search_route run made here with the real workflow, retriever stubbed),
each copy with its own question id, writes its page with `drmas_bench.report.view`, then opens the
page in headless Chromium and reads the browser's performance entries (first paint, first
contentful paint, the page script's own ready time). Prints file size, build seconds and those
times. Repeated records compress better than unique ones; the size of one copy of the source
records is printed beside it so the figure can be scaled.

Also the helpers of tests/test_view.py (one place for the scripted run and the browser driving).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

SEARCH_AGENTS = ("verifier", "searcher", "answerer")


class ScriptedBackend:
    """Answers by a fixed script keyed on the question number, so runs mix right, wrong, invalid,
    searched and unsearched episodes the same way every time."""

    def __init__(self, qn: int) -> None:
        self.qn, self.calls = qn, 0

    def worker_group(self, agent: str) -> str:
        return "shared"

    def sampling(self, agent: str):
        from drmas_bench.types import Sampling

        return Sampling(max_new_tokens=64)

    async def generate(self, agent: str, request) -> Any:
        from drmas_bench.types import Completion

        self.calls += 1
        q, c = self.qn, self.calls
        if agent == "verifier":
            text = "<verify>no</verify>" if (q % 3 and c < 3 * (q % 3)) else "<verify>yes</verify>"
            if q % 7 == 6:
                text = "I think we should search more."  # no verify tag: invalid, routes to the answerer
            if q % 13 == 12:
                text = "<verify>no</verify>"  # searches at every step: at the last one nobody acts
        elif agent == "searcher":
            text = f"<think>look it up</think><search>capital of country {q}</search>"
        else:
            gold = "Paris" if q % 2 == 0 else "Rome"
            text = f"<think>from the passages</think><answer>{gold if q % 5 != 4 else 'Berlin'}</answer>"
            if q % 11 == 10:
                text = "Paris"  # no tags at all: invalid, the episode ends without an answer
        return Completion(text, prompt_tokens=40 + 10 * c, completion_tokens=len(text) // 4, latency_s=0.01 * c,
                          finish="stop")


class StubRetriever:
    def search(self, queries, k):
        return [[{"title": f"Doc on {q}", "text": f"The city named in {q} is Paris or Rome."} for _ in range(k)]
                for q in queries]


def scripted_search_run(out: str | Path, questions: int = 12, n: int = 1) -> Path:
    """A run directory (config.yaml + samples.jsonl) of the real search_route workflow answered by
    `ScriptedBackend`, graded as the runner grades QA (EM of the final answer)."""
    from drmas_bench.grading.qa import grade_qa
    from drmas_bench.types import Task
    from drmas_bench.workflows.base import Episode
    from drmas_bench.suites.search.search_route import search_route

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    for qn in range(questions):
        task = Task(id=f"q{qn}", benchmark="hotpotqa" if qn % 4 else "nq", question=f"What is the capital of country {qn}?",
                    answers=["Paris" if qn % 2 == 0 else "Rome"])
        for s in range(n):
            ep = Episode(task, s, ScriptedBackend(qn), SEARCH_AGENTS, retriever=StubRetriever())
            asyncio.run(search_route(ep))
            t = ep.finish()
            g = grade_qa(t.final_answer, t.task.answers) if t.final_answer is not None else None
            t.reward = 1.0 if g and g.em else 0.0
            t.extra.update({"em": float(t.correct)})
            lines.append(json.dumps(t.to_dict()))
    team = {"workflow": "search_route", "agents": {a: "shared" for a in SEARCH_AGENTS},
            "worker_groups": {"shared": {"model": "scripted", "engine": "hf"}}}
    config = {"identity": {"team": team, "sampling": {a: {"temperature": 0.6, "top_p": 0.95, "max_new_tokens": 64}
                                                      for a in SEARCH_AGENTS}, "seed": 0},
              "suite": "search", "workflow": "search_route", "benchmarks": ["hotpotqa", "nq"], "n": n}
    (out / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    (out / "samples.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


class ScriptedMathBackend:
    """math_refine by script. Round 1: the solver boxes the right answer (question number % 3 == 0),
    a wrong one (1) or none (2); the verifier rejects rounds it should (1, 2) and, wrongly, every
    fourth right one. Round 2: right on even questions, wrong on odd ones."""

    def __init__(self, qn: int) -> None:
        self.qn, self.calls = qn, 0

    worker_group = ScriptedBackend.worker_group
    sampling = ScriptedBackend.sampling

    async def generate(self, agent: str, request) -> Any:
        from drmas_bench.types import Completion

        self.calls += 1
        q, c = self.qn, self.calls
        if agent == "verifier":
            text = "<verify>reject</verify>" if q % 3 or q % 4 == 0 else "<verify>approve</verify>"
        elif c == 1:
            text = [f"So the answer is \\boxed{{{q + 1}}}.", f"It is \\boxed{{{q + 2}}}.", f"The answer is {q + 1}."][q % 3]
        else:
            text = f"Checked again: \\boxed{{{q + 1 if q % 2 == 0 else q + 3}}}."
        return Completion(text, prompt_tokens=60 + 10 * c, completion_tokens=len(text) // 4, latency_s=0.02 * c)


def scripted_math_run(out: str | Path, questions: int = 9) -> Path:
    """A run directory of the real math_refine workflow answered by `ScriptedMathBackend`, graded by
    the reference's boxed extraction against the gold."""
    from drmas_bench.grading.extract import reference_boxed
    from drmas_bench.types import Task
    from drmas_bench.workflows.base import Episode
    from drmas_bench.suites.math.math_refine import math_refine

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    for qn in range(questions):
        task = Task(id=str(qn), benchmark="aime24", question=f"What is {qn} + 1?", answers=[str(qn + 1)])
        ep = Episode(task, 0, ScriptedMathBackend(qn), ("solver", "verifier"))
        asyncio.run(math_refine(ep))
        t = ep.finish()
        t.reward = 1.0 if reference_boxed(t.final_answer) == task.answers[0] else 0.0
        t.extra.update({"grade": "ok", "extracted": reference_boxed(t.final_answer)})
        lines.append(json.dumps(t.to_dict()))
    team = {"workflow": "math_refine", "agents": {"solver": "shared", "verifier": "shared"},
            "worker_groups": {"shared": {"model": "scripted", "engine": "hf"}}}
    config = {"identity": {"team": team, "sampling": {}, "seed": 0}, "suite": "math", "workflow": "math_refine",
              "benchmarks": ["aime24"], "n": 1}
    (out / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    (out / "samples.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def repeat_run(src: str | Path, dst: str | Path, total: int) -> Path:
    """A copy of run `src` holding `total` trajectories: its selected records repeated, copy k's
    question ids suffixed ``~k`` (so each is its own question), config's question_ids dropped."""
    from drmas_bench.report.runs import load_run

    run = load_run(src)
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    cfg = dict(run.config)
    cfg.pop("question_ids", None)
    cfg.pop("limit", None)
    with open(dst / "samples.jsonl", "w", encoding="utf-8") as f:
        for i in range(total):
            rec = json.loads(json.dumps(run.records[i % len(run.records)]))
            rec["task"]["id"] = f"{rec['task']['id']}~{i // len(run.records)}"
            f.write(json.dumps(rec) + "\n")
    (dst / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return dst


# ------------------------------------------------------------------ the browser


def browser() -> str | None:
    """The headless browser to drive: $CHROMIUM, else chromium / chromium-browser / google-chrome on PATH."""
    for name in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


CONSOLE = re.compile(r":(INFO|WARNING|ERROR):CONSOLE[^\]]*\] \"(.*)\", source")


# A page inside a frame of a given width: headless Chromium lays a window out at least 500 px wide,
# so a phone's width (390 px) is tested in a frame of that width. The frame's test hook result is
# copied out once its page says it is ready (file:// frames are readable with
# --allow-file-access-from-files).
FRAME = """<!doctype html><html><body style="margin:0">
<iframe id="f" src="{url}" style="width:{w}px;height:{h}px;border:0"></iframe><pre id="test-result"></pre>
<script>
const f = document.getElementById("f");
function copy() {{
  const d = f.contentDocument;
  if (d && d.body && d.body.dataset.ready) document.getElementById("test-result").textContent = d.getElementById("test-result").textContent;
  else setTimeout(copy, 50);
}}
f.addEventListener("load", copy);
</script></body></html>"""


def open_page(page: str | Path, query: str = "", screenshot: str | Path | None = None, budget_ms: int = 8000,
              size: str = "1280,1400", frame_width: int | None = None) -> dict[str, Any]:
    """Load `page` in headless Chromium with `?test=1&` + `query`, let its script run, and return what
    its test hook wrote (#test-result: rows shown, turns drawn, script errors, paint times, the
    page's scroll width) plus the browser's console messages (``console``), the wall seconds of
    the browser run and the DOM it ended with (``dom``). ``frame_width``: lay the page out that many CSS pixels wide (in a frame; a
    phone is 390)."""
    exe = browser()
    if exe is None:
        raise RuntimeError("no headless browser (install Debian's chromium package)")
    url = Path(page).resolve().as_uri() + "?test=1" + (("&" + query) if query else "")
    with tempfile.TemporaryDirectory() as profile:
        if frame_width:
            h = int(size.split(",")[1])
            wrapper = Path(profile) / "frame.html"
            wrapper.write_text(FRAME.format(url=url, w=frame_width, h=h), encoding="utf-8")
            url = wrapper.as_uri()
            size = f"{max(frame_width, 500)},{h}"
        base = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", f"--user-data-dir={profile}",
                "--enable-logging=stderr", "--v=0", f"--virtual-time-budget={budget_ms}", f"--window-size={size}",
                "--allow-file-access-from-files"]
        t0 = time.perf_counter()
        p = subprocess.run(base + ["--dump-dom", url], capture_output=True, text=True, timeout=180)
        wall = time.perf_counter() - t0
        if screenshot:
            subprocess.run(base + [f"--screenshot={Path(screenshot).resolve()}", url], capture_output=True, timeout=180)
    m = re.search(r'<pre id="test-result"[^>]*>(.*?)</pre>', p.stdout, re.DOTALL)
    import html as _html

    result = json.loads(_html.unescape(m.group(1))) if m and m.group(1).strip() else {}
    result["console"] = [(lvl, msg) for lvl, msg in CONSOLE.findall(p.stderr)]
    result["browser_s"] = wall
    result["dom"] = p.stdout  # the page as the browser left it (what a reader sees, as text)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", help="a real run directory whose records are repeated (default: a scripted search run)")
    ap.add_argument("--total", type=int, default=10000, help="trajectories in the synthetic run")
    ap.add_argument("--keep", help="build in this folder and keep it (default: a temporary one)")
    ap.add_argument("--screenshot", help="also save a screenshot of the page here")
    args = ap.parse_args(argv)
    from drmas_bench.report.view import write_view

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-view-"))
    src = Path(args.run) if args.run else scripted_search_run(work / "scripted", questions=40, n=2)
    big = repeat_run(src, work / "big", args.total)
    t0 = time.perf_counter()
    page = write_view([big], work / "big.html")
    build = time.perf_counter() - t0
    one_copy = (Path(src) / "samples.jsonl").stat().st_size
    res = open_page(page, "correct=incorrect&open=0", screenshot=args.screenshot, budget_ms=20000)
    print(f"trajectories: {args.total} (records of {src} repeated)")
    print(f"samples.jsonl: {(big / 'samples.jsonl').stat().st_size / 1e6:.1f} MB; one copy of the source: {one_copy / 1e3:.0f} kB")
    html = page.read_text(encoding="utf-8")
    index = len(re.search(r'id="index">(.*?)</script>', html, re.DOTALL).group(1).encode())
    print(f"page: {page.stat().st_size / 1e6:.2f} MB (index {index / 1e6:.2f} MB, compressed turns the rest), "
          f"built in {build:.1f} s")
    print(f"first paint: {res.get('first_paint_ms')} ms; first contentful paint: {res.get('first_contentful_paint_ms')} ms; "
          f"DOMContentLoaded: {res.get('dom_content_loaded_ms')} ms; summary and list drawn: {res.get('list_ms')} ms; "
          f"a trajectory opened: {res.get('ready_ms')} ms; browser run {res['browser_s']:.1f} s")
    print(f"filtered to incorrect: {res.get('shown')} of {res.get('total')}; turns of the opened one: {res.get('turns')}; "
          f"script errors: {res.get('errors')}; console: {res['console']}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
