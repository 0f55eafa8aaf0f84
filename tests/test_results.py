"""The one results layer: leaderboards and summaries compute their numbers with the
same functions, the long CSV holds exactly the wide CSV's cells, one samples.jsonl reader, one retry
policy, one SQuAD normalisation, registries as the one list of names. Run directories are written by
hand (config.yaml + samples.jsonl); the retry tests use a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import csv
import io
import json
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import yaml

from drmas_bench import report
from drmas_bench.cli import main as cli_main
from drmas_bench.metrics import MACRO, MICRO, summarize
from drmas_bench.run_samples import read_samples
from drmas_bench.types import UserError
from drmas_retrieval.retry import RetriesExhausted, RetryPolicy, send_with_retries

BENCHES = (("aime24", 9), ("math500", 14))


def records(seed: int = 0, n: int = 4) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for bench, n_q in BENCHES:
        for q in range(n_q):
            p = rng.random()
            for s in range(n):
                ok = rng.random() < p
                out.append({"task": {"benchmark": bench, "id": f"q{q}", "question": "?", "answers": ["1"], "meta": {}},
                            "sample_idx": s, "correct": ok, "reward": float(ok), "wall_s": 1.0, "turns": []})
    return out


def write_run(path: Path, recs: list[dict], n: int = 4) -> Path:
    path.mkdir(parents=True)
    cfg = {"suite": "math", "workflow": "math_refine", "n": n, "benchmarks": [b for b, _ in BENCHES],
           "identity": {"seed": 0, "team": {}, "sampling": {}}}
    (path / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    (path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_long_csv_holds_exactly_the_wide_csv_cells(tmp_path):
    a = write_run(tmp_path / "runs" / "a", records(0))
    b = write_run(tmp_path / "runs" / "b", records(1, n=2), n=2)
    out = tmp_path / "lb"
    assert cli_main(["leaderboard", str(a), str(b), "--metric", "avg@n,pass@n,pass@2,pass@4,avg@16", "--ci",
                     "--n-boot", "50", "--out", str(out)]) == 0
    wide = list(csv.DictReader(io.StringIO((out / "math.csv").read_text())))
    long_rows = list(csv.DictReader(io.StringIO((out / "math_long.csv").read_text())))
    assert list(long_rows[0]) == ["run", "benchmark", "metric", "value", "ci_lo", "ci_hi"]
    cols = ["aime24", "math500", MICRO, MACRO]
    want = {}
    for w in wide:
        for c in cols:
            if w.get(c):  # empty = not computed (pass@4 at n=2): absent from the long file
                want[(w["run"], c, w["metric"])] = (w[c], w.get(f"{c} ci_lo", ""), w.get(f"{c} ci_hi", ""))
    got = {(r["run"], r["benchmark"], r["metric"]): (r["value"], r["ci_lo"], r["ci_hi"]) for r in long_rows}
    assert got == want
    assert ("b", "aime24", "pass@4") not in got and ("a", "aime24", "pass@4") in got
    assert any(k[0].startswith("[paper]") for k in got)  # the paper's reported rows come along
    assert all(lo and hi for (run, _, _), (_, lo, hi) in got.items() if not run.startswith("[paper]"))


def test_leaderboard_and_summary_numbers_come_from_the_same_functions(tmp_path):
    recs = records(3)
    run = report.load_run(write_run(tmp_path / "r", recs))
    s = summarize(recs, n_boot=20)
    for name, key in (("avg@n", "avg@n"), ("pass@n", "pass@n"), ("pass@2", "2")):
        row = report.run_row(run, report.parse_metrics(name)[0], ci=False, n_boot=20, seed=0)
        for col, blk in [(b, s["benchmarks"][b]) for b, _ in BENCHES] + [(MICRO, s["micro"]), (MACRO, s["macro"])]:
            summary_value = blk["pass@k"][key] if key == "2" else blk[key]
            assert row.cells[col].value == summary_value, (name, col)  # equal, not approximately


def test_one_samples_reader_for_store_and_reports(tmp_path):
    run = write_run(tmp_path / "r", records(0))
    path = run / "samples.jsonl"
    first = json.loads(path.read_text().splitlines()[0])
    with open(path, "a") as f:  # a repeated key (the later copy wins) and a line cut off by a kill
        f.write(json.dumps({**first, "correct": not first["correct"], "reward": 1.0 - first["reward"]}) + "\n"
                + '{"task": {"bench')
    recs = read_samples(path)
    assert len(recs) == sum(n for _, n in BENCHES) * 4
    again = next(r for r in recs if (r["task"]["id"], r["sample_idx"], r["task"]["benchmark"]) ==
                 (first["task"]["id"], first["sample_idx"], first["task"]["benchmark"]))
    assert again["correct"] is (not first["correct"]) and again["reward"] == 1.0 - first["reward"]
    assert report.load_run(run).records == recs  # reports read through the same reader
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:3] + ["{not json"] + lines[3:-1]) + "\n")
    with pytest.raises(UserError, match=r"samples\.jsonl:4: not a trajectory record"):
        read_samples(path)
    assert read_samples(tmp_path / "none.jsonl", missing_ok=True) == []
    with pytest.raises(UserError, match="not found"):
        read_samples(tmp_path / "none.jsonl")


class _Flaky(BaseHTTPRequestHandler):
    """A real server for the retry policy: /busy answers 503 twice then 200, /rate 429 with a
    Retry-After, /bad 400 (never retried)."""

    hits: dict[str, int] = {}

    def do_POST(self):  # noqa: N802 (http.server's name)
        n = self.hits[self.path] = self.hits.get(self.path, 0) + 1
        code = {"/busy": 503 if n <= 2 else 200, "/rate": 429, "/bad": 400}.get(self.path, 404)
        body = json.dumps({"n": n}).encode()
        self.send_response(code)
        if code == 429:
            self.send_header("Retry-After", "0.05")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def flaky_url():
    _Flaky.hits = {}
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_one_retry_policy(flaky_url):
    policy = RetryPolicy(retries=3, backoff_s=0.001, backoff_max_s=0.2)
    attempts = []
    with httpx.Client(timeout=5) as c:
        r = send_with_retries(lambda: c.post(flaky_url + "/busy"), policy, on_attempt=lambda: attempts.append(1))
        assert r.status_code == 200 and len(attempts) == 3
        assert send_with_retries(lambda: c.post(flaky_url + "/bad"), policy).status_code == 400  # final, once
        assert _Flaky.hits["/bad"] == 1
        with pytest.raises(RetriesExhausted, match=r"failed after 2 attempt\(s\): HTTP 429") as e:
            send_with_retries(lambda: c.post(flaky_url + "/rate"), RetryPolicy(retries=1, backoff_s=0.001))
        assert e.value.attempts == 2 and _Flaky.hits["/rate"] == 2
    # waits: exponential, capped, jittered within +-25%, lengthened by Retry-After up to the cap
    p = RetryPolicy(retries=5, backoff_s=1.0, backoff_max_s=4.0, jitter=0.5)
    for retry, base in ((0, 1.0), (1, 2.0), (2, 4.0), (5, 4.0)):
        w = p.wait_s(retry)
        assert 0.75 * base <= w <= min(4.0, 1.25 * base)
    assert p.wait_s(0, "3") == 3.0 and p.wait_s(0, "60") == 4.0 and 0.75 <= p.wait_s(0, "Wed, 21 Oct") <= 1.25
    with pytest.raises(ValueError):
        RetryPolicy(retries=-1)


def test_one_squad_normalisation():
    from drmas_bench.grading.qa import grade_qa, normalize_qa
    from drmas_retrieval.evaluate import contains_answer, normalize_answer
    from drmas_retrieval.text import normalize_squad

    assert normalize_qa is normalize_squad and normalize_answer is normalize_squad
    assert normalize_squad("The Jay-Z!") == "jayz"
    assert grade_qa("jayz", ["Jay-Z"]).em == 1.0
    assert contains_answer(normalize_squad("A song by Jay-Z, 1996."), [normalize_squad("Jay-Z")])


def test_registries_are_the_one_list_of_names():
    import argparse

    from drmas_bench.agents.team import ENGINE_KINDS
    from drmas_bench.commands import report as report_cmd
    from drmas_bench.engines import ENGINES
    from drmas_bench.suites.registry import suite_names

    assert ENGINE_KINDS == tuple(ENGINES)
    parser = argparse.ArgumentParser()
    report_cmd.register(parser.add_subparsers())
    cost = parser._subparsers._group_actions[0].choices["cost"]  # noqa: SLF001 (argparse has no public lookup)
    choices = {a.dest: a.choices for a in cost._actions if a.choices}
    assert list(choices["suite"]) == list(suite_names()) and list(choices["engine"]) == list(ENGINES)
