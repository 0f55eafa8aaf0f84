"""How the harness itself scales with the number of episodes, the model's cost taken out.

    python scripts/bench_scale.py --data-dir ../shared/data                      # 2k / 20k / 100k episodes
    python scripts/bench_scale.py --data-dir ../shared/data --sizes 2000,20000 --keep bench-scale/

Every size runs the real command line, each step in its own process (``drmas-bench eval ... --suite
search --n 16 --limit L --concurrency 256``; L per benchmark is chosen so that the questions x 16 come
closest to the size), served by ``InstantDoubleEngine``: a test double of an engine, registered through
the engine registry (``drmas_bench.engines.ENGINES``, the one place a backend is added) and answering at
once in the reference's tags. Each episode of the search workflow then makes 4 calls and 1 retrieval
(the verifier asks for a search, the searcher searches the question, the verifier accepts, the answerer
answers with the first retrieved title), against the default in-process BM25 index of the mini corpus.

Per size it measures:

- the fresh run: wall, CPU per episode (the process's user + system time), peak RSS;
- finished but not yet written: the largest gap, sampled every 20 ms, between the episodes the double
  has finished (its answerer calls) and the lines in ``RUN/samples.jsonl``;
- summary CPU: the run's CPU after its last sample line is on disk (the summary, closing down);
- re-open: the same command again on the finished run (nothing to run), its CPU as a share of the fresh
  run's;
- ``drmas-bench view RUN``: the page's size, CPU and peak RSS; ``drmas-bench leaderboard RUN``: CPU and
  peak RSS.

It prints a Markdown table (and ``--json FILE`` keeps the figures). Memory per episode is the slope of
peak RSS between the smallest and each larger size. The last column is the machine's 1-minute load
average at the start and end of each step (lowest to highest): on a shared machine the wall times
depend on it, the CPU columns much less. Run it with ``nice -n 10`` on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ENGINE_KIND = "instant-double"
# the search suite's benchmarks and their sizes here (drmas_bench.benchmarks.search; 38,446 questions)
SEARCH_SIZES = {"nq": 3610, "triviaqa": 11313, "popqa": 1000, "hotpotqa": 7405, "2wiki": 12576,
                "musique": 2417, "bamboogle": 125}
N_SAMPLES = 16


# ------------------------------------------------------------------------------------- the test double


@dataclass
class InstantDoubleOptions:
    max_batch: int = 32  # accepted (the eval's generic micro-batch option reaches every engine), unused


class InstantDoubleEngine:
    """A test double of an engine: no model, answers every request at once, in the reference's tags.

    verifier: ``<verify>no</verify>`` until the history holds an observation, then ``<verify>yes</verify>``;
    searcher: a ``<search>`` of the question; answerer: the first retrieved passage's title in
    ``<answer>``. Token counts are the words of prompt and reply. ``finished`` counts answerer replies
    (one per search_route episode), for the scale bench's not-yet-written gauge; with
    ``$DRMAS_DOUBLE_FINISHED`` set, each one also appends a byte to that file (a count that survives
    SIGKILL, for the kill tests)."""

    name = ENGINE_KIND
    Options = InstantDoubleOptions
    finished = 0
    _tally_fd: int | None = None

    def __init__(self, model: str, **options: Any):
        self.model = model
        self.options = InstantDoubleOptions(**options)
        self._awake = True

    @staticmethod
    def reply(agent: str, prompt: str) -> str:
        if agent == "verifier":
            return "<verify>yes</verify>" if "<information>" in prompt else "<verify>no</verify>"
        if agent == "searcher":
            q = re.search(r"Question: (.*)", prompt)
            return f"<think>look it up</think><search>{q.group(1).strip() if q else 'unknown'}</search>"
        title = re.search(r'Doc 1: \\"(.*?)\\"', prompt)
        return f"<think>the first passage</think><answer>{title.group(1) if title else 'unknown'}</answer>"

    async def generate(self, requests: list) -> list:
        from drmas_bench.types import Completion

        out = []
        for r in requests:
            prompt = r.messages[-1]["content"]
            text = self.reply(r.agent, prompt)
            out.append(Completion(text, prompt_tokens=len(prompt.split()), completion_tokens=len(text.split())))
            if r.agent == "answerer":
                InstantDoubleEngine.finished += 1
                self._tally()
        return out

    @classmethod
    def _tally(cls) -> None:
        path = os.environ.get("DRMAS_DOUBLE_FINISHED")
        if path:
            if cls._tally_fd is None:
                cls._tally_fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.write(cls._tally_fd, b".")

    async def sleep(self) -> None:
        self._awake = False

    async def wake(self) -> None:
        self._awake = True

    @property
    def is_awake(self) -> bool:
        return self._awake

    def footprint_bytes(self) -> int:
        return 0

    async def close(self) -> None:
        self._awake = False


def register_double() -> None:
    """Add the double to the engine registry, as any new backend is added (before the CLI is built)."""
    from drmas_bench.engines import ENGINES

    ENGINES[ENGINE_KIND] = f"{Path(__file__).stem}:InstantDoubleEngine"


# ------------------------------------------------------------------------------- one measured command


class WriteGauge:
    """Samples, every `every_s`, finished episodes (the double's count) minus lines in samples.jsonl;
    keeps the maximum and the process CPU / wall when the last expected line appears."""

    def __init__(self, samples: Path, expected: int, every_s: float = 0.02):
        self.samples, self.expected, self.every_s = samples, expected, every_s
        self.max_unwritten, self.written, self._offset = 0, 0, 0
        self.cpu_at_last_write: float | None = None
        self.wall_at_last_write: float | None = None
        self._stop = threading.Event()
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> WriteGauge:
        if self.samples.is_file():
            self._offset = self.samples.stat().st_size  # lines already there belong to an earlier run
        self._thread.start()
        return self

    def _sample(self) -> None:
        if self.samples.is_file():
            with open(self.samples, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
            self._offset += len(chunk)
            self.written += chunk.count(b"\n")
        me = sys.modules.get(Path(__file__).stem)
        finished = me.InstantDoubleEngine.finished if me is not None else 0
        self.max_unwritten = max(self.max_unwritten, finished - self.written)
        if self.cpu_at_last_write is None and self.expected and self.written >= self.expected:
            self.cpu_at_last_write = time.process_time()
            self.wall_at_last_write = time.perf_counter() - self._t0

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self._sample()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def child(report: Path, run_dir: Path | None, expected: int, argv: list[str]) -> int:
    """Run ``drmas-bench ARGV`` in this process with the double registered; write the figures to `report`."""
    main_module = sys.modules["__main__"]
    if Path(getattr(main_module, "__file__", "") or "").resolve() == Path(__file__).resolve():
        sys.modules.setdefault(Path(__file__).stem, main_module)  # the registry imports this very module
    register_double()
    from drmas_bench.cli import main as cli_main

    gauge = WriteGauge(run_dir / "samples.jsonl", expected).start() if run_dir is not None else None
    t0 = time.perf_counter()
    rc = 1
    try:
        rc = cli_main(argv)
    finally:
        wall = time.perf_counter() - t0
        cpu = time.process_time()
        if gauge is not None:
            gauge.stop()
        fig: dict[str, Any] = {"rc": rc, "wall_s": wall, "cpu_s": cpu,
                               "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
        if gauge is not None:
            fig.update(max_unwritten=gauge.max_unwritten, written=gauge.written,
                       tail_cpu_s=None if gauge.cpu_at_last_write is None else cpu - gauge.cpu_at_last_write,
                       wall_at_last_write_s=gauge.wall_at_last_write)
        report.write_text(json.dumps(fig))
    return rc


def measured(argv: list[str], *, run_dir: Path | None = None, expected: int = 0, log: Path, nice: int = 0) -> dict:
    """``drmas-bench ARGV`` in a fresh process (`child`): its figures; a failure stops the bench."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        report = Path(f.name)
    cmd = [sys.executable, __file__, "--child", str(report), "--child-run", str(run_dir or ""),
           "--child-expected", str(expected), "--", *argv]
    start_load = os.getloadavg()[0]
    with open(log, "ab") as out:
        r = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT,
                           preexec_fn=(lambda: os.nice(nice)) if nice else None)
    fig = json.loads(report.read_text()) if report.stat().st_size else {"rc": r.returncode}
    report.unlink()
    fig["load_1min"] = [start_load, os.getloadavg()[0]]  # the machine's load average when the step began and ended
    if r.returncode != 0 or fig.get("rc") not in (0, None):
        sys.exit(f"bench_scale: `drmas-bench {' '.join(argv)}` failed (exit {r.returncode}); see {log}")
    return fig


# -------------------------------------------------------------------------------------------- sizes


def limit_for(episodes: int, n: int = N_SAMPLES) -> tuple[int, int]:
    """(--limit L, questions x n) with L per benchmark of the search suite chosen so that the run's
    episodes come closest to `episodes`."""
    best = (1, 0)
    for lim in range(1, max(SEARCH_SIZES.values()) + 1):
        total = n * sum(min(lim, s) for s in SEARCH_SIZES.values())
        if abs(total - episodes) < abs(best[1] - episodes):
            best = (lim, total)
        if total >= episodes:
            break
    return best


def eval_argv(run: Path, data_dir: str, limit: int) -> list[str]:
    return ["eval", "--model", "tiny-random", "--engine", ENGINE_KIND, "--suite", "search", "--n", str(N_SAMPLES),
            "--limit", str(limit), "--concurrency", "256", "--data-dir", data_dir, "--out", str(run)]


def bench_size(size: int, data_dir: str, work: Path, nice: int) -> dict:
    limit, episodes = limit_for(size)
    run = work / f"run-{size}"
    log = work / f"log-{size}.txt"
    shutil.rmtree(run, ignore_errors=True)
    argv = eval_argv(run, data_dir, limit)
    print(f"[bench_scale] {episodes} episodes (--limit {limit} x {N_SAMPLES}): fresh run", file=sys.stderr, flush=True)
    fresh = measured(argv, run_dir=run, expected=episodes, log=log, nice=nice)
    print(f"[bench_scale]   wall {fresh['wall_s']:.0f} s; re-open", file=sys.stderr, flush=True)
    again = measured(argv, run_dir=run, expected=0, log=log, nice=nice)
    page = work / f"view-{size}.html"
    print("[bench_scale]   view", file=sys.stderr, flush=True)
    view = measured(["view", str(run), "--out", str(page)], log=log, nice=nice)
    print("[bench_scale]   leaderboard", file=sys.stderr, flush=True)
    board = measured(["leaderboard", str(run), "--no-paper", "--out", str(work / f"board-{size}")], log=log, nice=nice)
    return {"size": size, "episodes": episodes, "limit": limit, "fresh": fresh, "reopen": again, "view": view,
            "leaderboard": board, "view_bytes": page.stat().st_size}


def table(rows: list[dict]) -> str:
    base = rows[0]
    lines = ["| episodes | wall (s) | CPU / episode (ms) | peak RSS (MB) | RSS growth (KB / episode) | "
             "finished, not written (max) | summary CPU (ms / episode) | re-open CPU (% of fresh) | "
             "view page (MB) | view CPU (s) / peak RSS (MB) | leaderboard CPU (s) / peak RSS (MB) | load (1 min) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        f, e = r["fresh"], r["episodes"]
        growth = ("" if r is base else
                  f"{(f['peak_rss_mb'] - base['fresh']['peak_rss_mb']) * 1024 / (e - base['episodes']):.1f}")
        tail = f.get("tail_cpu_s")
        loads = [x for step in ("fresh", "reopen", "view", "leaderboard") for x in r[step].get("load_1min", [])]
        lines.append(
            f"| {e:,} | {f['wall_s']:.0f} | {f['cpu_s'] / e * 1e3:.2f} | {f['peak_rss_mb']:.0f} | {growth} | "
            f"{f['max_unwritten']:,} | {'' if tail is None else f'{tail / e * 1e3:.2f}'} | "
            f"{r['reopen']['cpu_s'] / f['cpu_s'] * 100:.0f} | {r['view_bytes'] / 1e6:.1f} | "
            f"{r['view']['cpu_s']:.1f} / {r['view']['peak_rss_mb']:.0f} | "
            f"{r['leaderboard']['cpu_s']:.1f} / {r['leaderboard']['peak_rss_mb']:.0f} | "
            f"{f'{min(loads):.1f}–{max(loads):.1f}' if loads else '–'} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="2000,20000,100000", help="episodes per run, comma-separated")
    ap.add_argument("--data-dir", default=os.environ.get("DRMAS_DATA_DIR"), help="benchmark files (default $DRMAS_DATA_DIR)")
    ap.add_argument("--keep", metavar="DIR", help="keep the run directories, pages and logs here (default: a temp dir)")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    ap.add_argument("--nice", type=int, default=0, help="niceness of the measured processes")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-run", help=argparse.SUPPRESS)
    ap.add_argument("--child-expected", type=int, default=0, help=argparse.SUPPRESS)
    args, rest = ap.parse_known_args()
    if args.child:
        return child(Path(args.child), Path(args.child_run) if args.child_run else None, args.child_expected,
                     rest[1:] if rest[:1] == ["--"] else rest)
    if not args.data_dir:
        ap.error("give --data-dir (or set DRMAS_DATA_DIR): the search suite's files and the mini corpus")
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    # one tiny run first: the BM25 index of the mini corpus is built (and cached) outside the figures
    measured(eval_argv(work / "warm-up", args.data_dir, 1)[:-2] + ["--out", str(work / "warm-up"), "--n", "1"],
             log=work / "log-warm-up.txt", nice=args.nice)
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        rows.append(bench_size(size, args.data_dir, work, args.nice))
        print(table(rows), file=sys.stderr, flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
    print(table(rows))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
