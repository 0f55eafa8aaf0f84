"""How big the run viewer's page is and how fast it first paints on a large run.

    python scripts/bench_view.py                       # a scripted search_route run, repeated to 10,000
    python scripts/bench_view.py --run runs/NAME --total 10000 --keep bench-view/
    nice -n 10 python scripts/bench_view.py --sizes 2000,20000,100000 --baseline main   # CPU and memory

`--sizes`: for each size a run directory is written as the store writes one (`synth_run`: the
records of a scripted search_route run, each copy its own question), and `drmas-bench view` of it
runs in a child process, by this tree's code and (`--baseline REF`) by the code of a git ref, on the
same run: CPU seconds, peak RSS, page size, and whether both wrote the same bytes.

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
from urllib.parse import quote

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


def synth_run(src: str | Path, dst: str | Path, total: int) -> Path:
    """A run directory of ``total`` trajectories written as the store writes one (samples.jsonl, the
    compact records, the index), straight from run ``src``'s selected records: record ``i`` is
    source record ``i % len``, its question id suffixed ``~copy`` (so each copy is its own question),
    the rest of it unchanged. Each source record is serialised once and the copies spliced from it,
    so 100,000 trajectories take seconds. The rows and turns are those of `repeat_run`'s copy."""
    import zlib

    from drmas_bench import compact
    from drmas_bench.report.runs import load_run
    from drmas_bench.run_stamps import mismatch_signature

    run = load_run(src)
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    cfg = dict(run.config)
    cfg.pop("question_ids", None)
    cfg.pop("limit", None)
    mark = "\u2063ID\u2063"  # an id no record holds: split on it, each copy's id goes between the parts
    forms = []
    for rec in run.records:
        t = {**rec, "task": {**rec["task"], "id": mark}}
        forms.append((str(rec["task"]["id"]), str(rec["task"]["benchmark"]), int(rec["sample_idx"]),
                      json.dumps(t, ensure_ascii=False).split(mark), compact.line(t, cfg.get("workflow")).split(mark),
                      mismatch_signature(t)))
    pos = 0
    with open(dst / "samples.jsonl", "wb") as fs, open(dst / compact.COMPACT, "w", encoding="utf-8") as fc, \
            open(dst / "samples.index", "w", encoding="utf-8") as fi:
        fc.write(compact.HEADER)
        for i in range(total):
            qid, bench, s, full, small, sig = forms[i % len(forms)]
            new = f"{qid}~{i // len(forms)}"
            raw = new.join(full).encode("utf-8")
            fs.write(raw + b"\n")
            fc.write(new.join(small))
            fi.write(json.dumps([bench, new, s, i + 1, pos, pos + len(raw) + 1, zlib.crc32(raw), sig],
                                ensure_ascii=False, separators=(",", ":")) + "\n")
            pos += len(raw) + 1
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


# Several queries of one page in one browser: a frame each, loaded one after the other; each frame's
# test hook result is collected once its page says it is ready, then the next frame is loaded.
FRAMES = """<!doctype html><html><head><meta charset="utf-8"></head><body style="margin:0"><pre id="test-result"></pre>
<script>
const urls = {urls}, out = [];
function next() {{
  if (out.length === urls.length) {{ document.getElementById("test-result").textContent = JSON.stringify(out); return; }}
  const f = document.createElement("iframe");
  f.style.cssText = "width:1280px;height:900px;border:0";
  f.src = urls[out.length];
  const done = () => {{
    const d = f.contentDocument;
    if (!(d && d.body && d.body.dataset.ready)) return setTimeout(done, 50);
    out.push(JSON.parse(d.getElementById("test-result").textContent || "{{}}"));
    f.remove();
    next();
  }};
  f.addEventListener("load", done);
  document.body.append(f);
}}
next();
</script></body></html>"""


def open_queries(page: str | Path, queries: list[str], budget_ms: int = 60000) -> list[dict[str, Any]]:
    """`open_page` of each of ``queries`` (``?test=1&`` + query), all in one headless browser run (a
    frame each, one after the other): what each page's test hook wrote, in order. The browser's
    console messages of the whole run are in each result's ``console``."""
    exe = browser()
    if exe is None:
        raise RuntimeError("no headless browser (install Debian's chromium package)")
    base_url = Path(page).resolve().as_uri() + "?test=1"
    urls = [base_url + (("&" + quote(q, safe="=&%")) if q else "") for q in queries]  # UTF-8, as a command line's
    with tempfile.TemporaryDirectory() as profile:
        wrapper = Path(profile) / "frames.html"
        wrapper.write_text(FRAMES.format(urls=json.dumps(urls)), encoding="utf-8")
        cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", f"--user-data-dir={profile}",
               "--enable-logging=stderr", "--v=0", f"--virtual-time-budget={budget_ms}", "--window-size=1300,1000",
               "--allow-file-access-from-files", "--dump-dom", wrapper.as_uri()]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    m = re.search(r'<pre id="test-result"[^>]*>(.*?)</pre>', p.stdout, re.DOTALL)
    import html as _html

    results = json.loads(_html.unescape(m.group(1))) if m and m.group(1).strip() else []
    console = [(lvl, msg) for lvl, msg in CONSOLE.findall(p.stderr)]
    for r in results:
        r["console"] = console
    return results


# ------------------------------------------------------------------ CPU and memory of `drmas-bench view`

CHILD = """
import json, resource, sys
from drmas_bench import cli
rc = cli.main(["view", sys.argv[1], "--out", sys.argv[2]])
ru = resource.getrusage(resource.RUSAGE_SELF)
# the process's own peak (VmHWM); ru_maxrss may carry the parent's peak over the fork
hwm = next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM:"))
print("BENCH_VIEW " + json.dumps({"rc": rc, "cpu_s": ru.ru_utime + ru.ru_stime, "peak_rss_mb": hwm / 1024}))
"""


def view_cost(run: str | Path, page: str | Path, code: str | Path | None = None) -> dict[str, Any]:
    """`drmas-bench view RUN --out PAGE` in a child process (the package from folder ``code`` when given,
    else the installed one): its exit code, CPU seconds (user + system), peak RSS (MB), the page's
    size and the size of the folder beside it (MB)."""
    env = dict(os.environ)
    if code is not None:
        env["PYTHONPATH"] = str(Path(code).resolve()) + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-c", CHILD, str(run), str(page)], capture_output=True, text=True, env=env)
    line = [x for x in p.stdout.splitlines() if x.startswith("BENCH_VIEW ")]
    if p.returncode != 0 or not line:
        raise RuntimeError(f"view of {run} failed: {p.stderr[-2000:]}")
    out = json.loads(line[-1].split(" ", 1)[1])
    page = Path(page)
    folder = page.with_name(page.stem + "_files")
    out["page_mb"] = page.stat().st_size / 1e6
    out["files_mb"] = sum(f.stat().st_size for f in folder.iterdir()) / 1e6 if folder.is_dir() else 0.0
    return out


def code_of(ref: str, into: Path) -> Path:
    """The package ``drmas_bench`` as of git ``ref`` of this repository, extracted into ``into``."""
    into.mkdir(parents=True, exist_ok=True)
    root = Path(__file__).resolve().parents[1]
    archive = subprocess.run(["git", "-C", str(root), "archive", ref, "drmas_bench"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def same_page(a: Path, b: Path) -> bool:
    """Whether two pages and the folders beside them hold the same bytes."""
    fa, fb = a.with_name(a.stem + "_files"), b.with_name(b.stem + "_files")
    names = sorted(f.name for f in fa.iterdir()) if fa.is_dir() else []
    if names != (sorted(f.name for f in fb.iterdir()) if fb.is_dir() else []):
        return False
    return a.read_bytes() == b.read_bytes() and all((fa / n).read_bytes() == (fb / n).read_bytes() for n in names)


def cost_table(work: Path, sizes: list[int], baseline: str | None, baseline_max: int,
               source: str | Path | None = None) -> list[dict[str, Any]]:
    """For each size: a run of that many trajectories (`synth_run` of run ``source``, default a scripted
    search run), its page by this tree's code and, up to ``baseline_max`` trajectories, by
    ``baseline``'s (a git ref)."""
    src = Path(source) if source else scripted_search_run(work / "scripted", questions=48, n=2)
    old = code_of(baseline, work / "baseline") if baseline else None
    rows = []
    for n in sizes:
        run = synth_run(src, work / f"run-{n}", n)
        page = {k: work / k / f"view-{n}.html" for k in ("after", "before")}  # one name: the page holds it
        row: dict[str, Any] = {"n": n, "samples_mb": (run / "samples.jsonl").stat().st_size / 1e6,
                               "after": view_cost(run, page["after"])}
        if old is not None and n <= baseline_max:
            row["before"] = view_cost(run, page["before"], old)
            row["same_page"] = same_page(page["after"], page["before"])
        rows.append(row)
        print(json.dumps(row), flush=True)
        shutil.rmtree(run)
    return rows


def print_cost(rows: list[dict[str, Any]]) -> None:
    print("| trajectories | samples.jsonl (MB) | CPU before / after (s) | CPU ratio | peak RSS before / after (MB) "
          "| RSS ratio | page (MB) | beside it (MB) | same page |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|:---|")
    for r in rows:
        a, b = r["after"], r.get("before")
        cpu = f"{b['cpu_s']:.1f} / {a['cpu_s']:.1f}" if b else f"– / {a['cpu_s']:.1f}"
        rss = f"{b['peak_rss_mb']:.0f} / {a['peak_rss_mb']:.0f}" if b else f"– / {a['peak_rss_mb']:.0f}"
        print(f"| {r['n']:,} | {r['samples_mb']:.0f} | {cpu} | {a['cpu_s'] / b['cpu_s']:.2f} |" if b else
              f"| {r['n']:,} | {r['samples_mb']:.0f} | {cpu} | |", end="")
        print(f" {rss} | {a['peak_rss_mb'] / b['peak_rss_mb']:.2f} |" if b else f" {rss} | |", end="")
        print(f" {a['page_mb']:.2f} | {a['files_mb']:.1f} | {r.get('same_page', '')} |")
    if len(rows) > 1:
        lo, hi = rows[0], rows[-1]
        per = (hi["after"]["peak_rss_mb"] - lo["after"]["peak_rss_mb"]) * 1e6 / (hi["n"] - lo["n"])
        print(f"after: peak RSS growth {per:.0f} bytes per trajectory ({lo['n']:,} to {hi['n']:,}); "
              f"CPU {hi['after']['cpu_s'] * 1e3 / hi['n']:.2f} ms per trajectory at {hi['n']:,}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", help="a real run directory whose records are repeated (default: a scripted search run)")
    ap.add_argument("--total", type=int, default=10000, help="trajectories in the synthetic run")
    ap.add_argument("--keep", help="build in this folder and keep it (default: a temporary one)")
    ap.add_argument("--screenshot", help="also save a screenshot of the page here")
    ap.add_argument("--sizes", help="instead: CPU, peak RSS and sizes of `drmas-bench view` at these sizes "
                                    "(comma-separated), e.g. 2000,20000,100000")
    ap.add_argument("--baseline", help="with --sizes: also measure the code of this git ref (e.g. main), same runs")
    ap.add_argument("--baseline-max", type=int, default=10**9,
                    help="with --baseline: measure it only up to this many trajectories (it holds every record)")
    args = ap.parse_args(argv)
    if args.sizes:
        work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-view-"))
        print_cost(cost_table(work, [int(x) for x in args.sizes.split(",")], args.baseline, args.baseline_max,
                              args.run))
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        return 0
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
