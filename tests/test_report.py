"""Leaderboards, paired comparisons and cost studies (drmas_bench/report.py) on real run dirs.

The run dirs are made by `drmas-bench eval` with the tiny random model (seconds each). Because that
model never solves the toy questions, some tests also use *relabelled copies*: the same real records
with `correct` rewritten by a fixed hash, so that every metric takes non-trivial values. Every
number the reports print is checked against an independent recomputation written here with exact
fractions (per-question success counts, avg, pass@k = 1 - C(n-c, k) / C(n, k), pass^k = C(c, k) / C(n, k)).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import re
import shutil
import zlib
from collections import defaultdict
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from drmas_bench import report
from drmas_bench.cli import main as cli_main
from drmas_bench.commands import report as report_cmd
from drmas_bench.metrics import MACRO, MICRO
from drmas_bench.pricing import load_prices
from drmas_bench.types import UserError

EVAL = ["eval", "--model", "tiny-random", "--suite", "toy", "--no-progress", "--concurrency", "64"]


def run_cmd(argv: list[str]) -> int:
    """Our sub-commands through their own parser (cli.COMMANDS is the lead's to edit)."""
    parser = argparse.ArgumentParser(prog="drmas-bench")
    report_cmd.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as e:
        print(f"drmas-bench: error: {e}")
        return 2


# ------------------------------------------------------------------------------ fixtures


def _relabel(src: Path, dst: Path, salt: str, split: bool) -> Path:
    """A copy of a real run with `correct` rewritten by a fixed hash; with `split`, odd-numbered
    tasks (every third) move to a second benchmark `toyx` (unequal sizes: macro != micro)."""
    shutil.copytree(src, dst)
    lines = []
    for line in (src / "samples.jsonl").read_text().splitlines():
        r = json.loads(line)
        tid = r["task"]["id"]
        h = zlib.crc32(f"{salt}|{tid}|{r['sample_idx']}".encode())
        level = zlib.crc32(tid.encode()) % 4  # per-question difficulty: 0..3 in 4 successes likely
        r["correct"] = (h % 4) < level
        r["reward"] = float(r["correct"])
        if split and int(tid.rsplit("-", 1)[1]) % 3 == 0:
            r["task"]["benchmark"] = "toyx"
        lines.append(json.dumps(r))
    (dst / "samples.jsonl").write_text("\n".join(lines) + "\n")
    cfg = yaml.safe_load((dst / "config.yaml").read_text())
    if split:
        cfg["benchmarks"] = ["toy", "toyx"]
    (dst / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return dst


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("runs")
    out = {
        "A": base / "tiny-a",
        "B": base / "tiny-b",
        "C": base / "tiny-c",
    }
    assert cli_main(EVAL + ["--n", "4", "--limit", "6", "--max-new-tokens", "8", "--out", str(out["A"])]) == 0
    assert cli_main(EVAL + ["--n", "4", "--limit", "6", "--max-new-tokens", "8", "--seed", "1", "--out", str(out["B"])]) == 0
    assert cli_main(EVAL + ["--n", "2", "--limit", "4", "--max-new-tokens", "6", "--temperature", "1.0",
                            "--out", str(out["C"])]) == 0
    out["A2"] = _relabel(out["A"], base / "relabelled-a", "a", split=True)
    out["B2"] = _relabel(out["B"], base / "relabelled-b", "b", split=True)
    out["C2"] = _relabel(out["C"], base / "relabelled-c", "c", split=False)
    return out


# ------------------------------------------------------- the independent recomputation


def counts(run: Path) -> dict[tuple[str, str], tuple[int, int]]:
    """(benchmark, task id) -> (c, n), from samples.jsonl and config.yaml alone."""
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    acc: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    seen = set()
    for line in (run / "samples.jsonl").read_text().splitlines():
        r = json.loads(line)
        key = (r["task"]["benchmark"], r["task"]["id"])
        assert (key, r["sample_idx"]) not in seen
        seen.add((key, r["sample_idx"]))
        if r["sample_idx"] < cfg["n"] and r["task"]["benchmark"] in cfg["benchmarks"]:
            acc[key][0] += bool(r["correct"])
            acc[key][1] += 1
    return {k: (c, n) for k, (c, n) in acc.items()}


def exact_pass(n: int, c: int, k: int) -> Fraction:
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


def exact_pass_hat(n: int, c: int, k: int) -> Fraction:
    return Fraction(math.comb(c, k), math.comb(n, k))


def expected(run: Path, metric: str) -> dict[str, Fraction | None]:
    """Column -> exact value of `metric` (avg@n, pass@n, pass^n, avg@K, pass@K, pass^K) for one run."""
    cq = counts(run)
    run_n = yaml.safe_load((run / "config.yaml").read_text())["n"]
    kind, sep, k = re.fullmatch(r"(avg|pass)([@^])(n|\d+)", metric).groups()
    per_q: dict[tuple[str, str], Fraction] = {}
    for key, (c, n) in cq.items():
        if kind == "avg":
            per_q[key] = Fraction(c, n)
        else:
            kk = run_n if k == "n" else int(k)
            if kk > n:
                return {}
            per_q[key] = exact_pass(n, c, kk) if sep == "@" else exact_pass_hat(n, c, kk)
    by_b: dict[str, list[Fraction]] = defaultdict(list)
    for (b, _), v in per_q.items():
        by_b[b].append(v)
    out: dict[str, Fraction | None] = {b: sum(v) / len(v) for b, v in by_b.items()}
    out[MICRO] = sum(per_q.values()) / len(per_q)
    out[MACRO] = sum(out[b] for b in by_b) / len(by_b)
    return out


def md_tables(md: str) -> dict[str, list[dict[str, str]]]:
    """'## suite: metric' -> list of rows (header -> cell) of the Markdown table below it."""
    out: dict[str, list[dict[str, str]]] = {}
    current, header = None, None
    for line in md.splitlines():
        if line.startswith("## "):
            current, header = line[3:].strip(), None
            out[current] = []
        elif current and line.startswith("|") and not set(line) <= set("|-: "):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if header is None:
                header = cells
            else:
                out[current].append(dict(zip(header, cells)))
        elif current and header is not None and not line.startswith("|"):
            current = None  # the table ended
    return out


def close_pct(text: str, value: Fraction, digits: int) -> bool:
    return abs(float(text) - 100 * float(value)) <= 0.5 * 10**-digits + 1e-9


# ----------------------------------------------------------------------------- leaderboard


@pytest.mark.slow
@pytest.mark.parametrize("which", [("A", "B", "C"), ("A2", "B2", "C2")])
def test_leaderboard_every_number_matches_independent_recomputation(runs, tmp_path, which):
    metrics = "avg@n,pass@n,pass@1,pass@2,avg@4,pass@4,pass^n,pass^2,pass^4"
    out = tmp_path / "lb"
    assert run_cmd(["leaderboard", *[str(runs[w]) for w in which], "--metric", metrics, "--out", str(out)]) == 0
    md = (out / "leaderboard.md").read_text()
    rows = list(csv.DictReader(io.StringIO((out / "toy.csv").read_text())))
    tables = md_tables(md)
    checked = 0
    for metric in metrics.split(","):
        md_rows = {r["run"]: r for r in tables[f"toy: {metric}"]}
        csv_rows = {r["run"]: r for r in rows if r["metric"] == metric}
        assert set(md_rows) == set(csv_rows) == {runs[w].name for w in which}  # no paper rows for toy
        for w in which:
            name = runs[w].name
            exp = expected(runs[w], metric)
            for col in ["toy", "toyx", MICRO, MACRO]:
                want = exp.get(col)
                got_csv, got_md = csv_rows[name].get(col, ""), md_rows[name].get(col, "–")
                if want is None:
                    assert got_csv == "" and got_md in ("–", None), (metric, name, col)
                    continue
                assert abs(float(got_csv) - 100 * float(want)) <= 5e-7, (metric, name, col, got_csv, want)
                assert close_pct(got_md, want, 1), (metric, name, col, got_md, want)
                checked += 1
    assert checked >= 60
    # n and sampling differences are flagged, not silently mixed
    c_notes = {r["metric"]: r["notes"] for r in rows if r["run"] == runs[which[2]].name}
    assert "n=2 differs (table: n=4)" in c_notes["avg@n"]
    assert "sampling differs: temperature 1 (table: 0.6), max_new_tokens 6 (table: 8)" in c_notes["avg@n"]
    assert "avg@4 asked but n=2: shows avg@n = avg@2" in c_notes["avg@4"]
    assert "pass@4 needs at least 4 samples per question; run has n=2" in c_notes["pass@4"]
    assert "pass^4 needs at least 4 samples per question; run has n=2" in c_notes["pass^4"]
    a_notes = {r["metric"]: r["notes"] for r in rows if r["run"] == runs[which[0]].name}
    assert a_notes["avg@n"] == ""
    if which[0] == "A2":  # the two-benchmark runs: C2 covers fewer benchmarks than the table
        assert "covers 1 of 2 benchmarks" in c_notes["avg@n"]
        exp = expected(runs["A2"], "avg@n")
        assert exp[MICRO] != exp[MACRO]


@pytest.mark.slow
def test_leaderboard_ci_and_stdout(runs, capsys):
    assert run_cmd(["leaderboard", str(runs["A2"]), str(runs["B2"]), "--ci", "--n-boot", "200"]) == 0
    out = capsys.readouterr().out
    cells = re.findall(r"(\d+\.\d) \[(\d+\.\d), (\d+\.\d)\]", out)
    assert len(cells) >= 12
    for v, lo, hi in cells:
        assert float(lo) <= float(v) + 0.05 and float(v) <= float(hi) + 0.05
    # the same seed gives the same CIs
    assert run_cmd(["leaderboard", str(runs["A2"]), str(runs["B2"]), "--ci", "--n-boot", "200"]) == 0
    assert capsys.readouterr().out == out


def test_paper_rows_are_reported_not_reproduced():
    paper = report.load_paper(required=True)
    rows = report.paper_rows(paper, "math", report.Metric("avg", 16))
    by = {r.label: r for r in rows}
    assert by["[paper] Qwen3-8B shared, multi-agent GRPO"].cells[MACRO].value == pytest.approx(0.578)
    assert by["[paper] Qwen3-8B shared, Dr. MAS"].cells[MACRO].value == pytest.approx(0.623)
    assert by["[paper] Qwen3-8B AIME24, Dr. MAS"].cells["aime24"].value == pytest.approx(0.548)
    assert all(r.source == "reported" and "reported in paper, not reproduced (REFERENCE.md §" in r.notes[0] for r in rows)
    # an avg@n / pass@n table takes the paper's avg@16 / pass@16 (the rows state n = 16)
    pass_n = {r.label: r for r in report.paper_rows(paper, "search", report.Metric("pass", None))}
    assert pass_n["[paper] Qwen2.5-7B non-shared, Dr. MAS"].cells[MACRO].value == pytest.approx(0.583)
    assert pass_n["[paper] verifier Qwen2.5-7B + searcher/answerer Llama-3.2-3B"].cells[MACRO].value == pytest.approx(0.575)
    assert report.paper_rows(paper, "math", report.Metric("pass", 8)) == []
    with pytest.raises(UserError, match="unknown key 'valeus'"):
        report.validate_paper({"rows": [{"suite": "math", "label": "x", "where": "y", "valeus": {}}]})
    with pytest.raises(UserError, match=r"percentage in \[0, 100\]"):
        report.validate_paper({"rows": [{"suite": "math", "label": "x", "where": "y", "values": {"avg@16": {"aime24": 0.5e3}}}]})


@pytest.mark.slow
def test_paper_rows_appear_in_a_matching_suite_table(runs, tmp_path):
    """A run relabelled as a math run (aime24) gets the paper's math rows in its tables."""
    run = _relabel(runs["A"], tmp_path / "as-math", "m", split=False)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg.update(suite="math", benchmarks=["aime24"])
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    recs = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    for r in recs:
        r["task"]["benchmark"] = "aime24"
    (run / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    tables = report.build_leaderboard([report.load_run(run)], report.parse_metrics("avg@n"),
                                      paper=report.load_paper(required=True))
    rows = {r.label: r for r in tables[0].rows}
    assert list(rows)[0] == "as-math"
    # an avg@n table shows the paper's avg@16 (its rows state n = 16), with n in its own column
    assert rows["[paper] Qwen3-8B AIME24, Dr. MAS"].n == "16" and rows["as-math"].n == "4"
    assert rows["[paper] Qwen3-8B AIME24, Dr. MAS"].cells["aime24"].value == pytest.approx(0.548)
    tables = report.build_leaderboard([report.load_run(run)], report.parse_metrics("avg@16"),
                                      paper=report.load_paper(required=True))
    t = tables[0]
    assert "[paper] Qwen3-8B AIME24, Dr. MAS" in [r.label for r in t.rows]
    md = report.table_markdown(t)
    assert "reported in paper, not reproduced" in md and "avg@16 asked but n=4" in md
    assert "not the paper's protocol (n=4)" in md  # the run's n differs from the paper's 16


@pytest.mark.slow
def test_trained_team_estimator_and_step(runs, tmp_path):
    run = tmp_path / "trained-run"
    shutil.copytree(runs["A"], run)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "team.yaml").write_text(yaml.safe_dump({"trained": {"estimator": "drmas", "step": 40}}))
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["argv"] = ["eval", "--model", str(ckpt), "--suite", "toy"]
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    r = report.load_run(run)
    assert (r.estimator, r.step) == ("drmas", 40)
    row = report.build_leaderboard([r], report.parse_metrics("avg@n"))[0].rows[0]
    assert (row.estimator, row.step, row.team, row.model) == ("drmas", "40", "shared", "tiny-random")


def test_leaderboard_notes_grading_timeouts(runs, tmp_path):
    """Samples whose grading timed out (graded wrong) are counted in the row's notes; none, no note."""
    run = tmp_path / "timeouts"
    shutil.copytree(runs["A"], run)
    lines = (run / "samples.jsonl").read_text().splitlines()
    recs = [json.loads(line) for line in lines]
    for r in recs[:3]:
        r["extra"] = {**(r.get("extra") or {}), "grade": "timeout"}
    (run / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    row = report.build_leaderboard([report.load_run(run)], report.parse_metrics("avg@n"))[0].rows[0]
    assert "3 grading timeouts (graded wrong)" in row.notes
    row = report.build_leaderboard([report.load_run(runs["A"])], report.parse_metrics("avg@n"))[0].rows[0]
    assert not any("grading timeouts" in n for n in row.notes)


def test_trained_reference_estimator_shows_its_group_index(tmp_path):
    """A reference estimator name means nothing without group_by_agent: the report shows both."""
    from drmas_bench.report.runs import _trained_info

    def info(trained):
        return _trained_info({"identity": {"team": {"trained": trained}}}, tmp_path)[:2]  # (estimator, step)

    assert info({"estimator": "agent_traj", "group_by_agent": True, "step": 3}) == ("agent_traj[by_agent]", 3)
    assert info({"estimator": "traj_traj", "group_by_agent": False, "step": 3}) == ("traj_traj[by_uid]", 3)
    assert info({"estimator": "drmas", "step": 3}) == ("drmas", 3)


@pytest.mark.slow
def test_metric_parsing_and_bad_inputs(tmp_path, runs, capsys):
    assert [m.name for m in report.parse_metrics("avg@16, pass@1,avg@n")] == ["avg@16", "pass@1", "avg@n"]
    for bad in ("avg16", "pass@0", "mean@4", ""):
        with pytest.raises(UserError):
            report.parse_metrics(bad)
    assert run_cmd(["leaderboard", str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().out
    assert run_cmd(["leaderboard", str(runs["A"]), "--metric", "top@3"]) == 2
    # a folder of run dirs expands to its run dirs
    assert report.expand_run_dirs([runs["A"].parent])[:3] == sorted(p for p in runs["A"].parent.iterdir())[:3]


# --------------------------------------------------------------------------------- compare


def test_sign_test_exact():
    assert report.sign_test_p(0, 0) == 1.0
    assert report.sign_test_p(5, 0) == pytest.approx(2 / 32)
    assert report.sign_test_p(3, 3) == 1.0
    assert report.sign_test_p(10, 2) == pytest.approx(2 * (1 + 12 + 66) / 4096)
    assert report.sign_test_p(2, 10) == report.sign_test_p(10, 2)


def _brute_sign_p(w: int, l: int) -> Fraction:
    m = w + l
    dev = abs(Fraction(w) - Fraction(m, 2))
    return sum((Fraction(math.comb(m, i), 2**m) for i in range(m + 1) if abs(Fraction(i) - Fraction(m, 2)) >= dev), Fraction(0))


@pytest.mark.slow
def test_compare_numbers_flips_and_sign_test(runs, tmp_path):
    out = tmp_path / "cmp.md"
    assert run_cmd(["compare", str(runs["A2"]), str(runs["B2"]), "--out", str(out), "--n-boot", "500"]) == 0
    md = out.read_text()
    ca, cb = counts(runs["A2"]), counts(runs["B2"])
    shared = sorted(set(ca) & set(cb))
    assert shared == sorted(ca)
    table = {r["benchmark"]: r for r in md_tables(md.replace("# Paired", "## Paired"))["Paired comparison: B vs A"]}
    for bench in ["toy", "toyx", MICRO]:
        keys = [k for k in shared if bench == MICRO or k[0] == bench]
        ra = [Fraction(*ca[k]) for k in keys]
        rb = [Fraction(*cb[k]) for k in keys]
        pa = [exact_pass(ca[k][1], ca[k][0], 4) for k in keys]
        pb = [exact_pass(cb[k][1], cb[k][0], 4) for k in keys]
        row = table[bench]
        assert int(row["shared questions"]) == len(keys)
        assert close_pct(row["A avg@n"], sum(ra) / len(keys), 1) and close_pct(row["B avg@n"], sum(rb) / len(keys), 1)
        assert close_pct(row["A pass@k"], sum(pa) / len(keys), 1) and close_pct(row["B pass@k"], sum(pb) / len(keys), 1)
        d_avg = (sum(rb) - sum(ra)) / len(keys)
        assert close_pct(row["Δ avg (pts) [95% CI]"].split(" [")[0], d_avg, 1)
        lo, hi = map(float, re.search(r"\[([-+\d.]+), ([-+\d.]+)\]", row["Δ avg (pts) [95% CI]"]).groups())
        assert lo <= hi
        wins = sum(1 for x, y in zip(ra, rb) if y > x)
        losses = sum(1 for x, y in zip(ra, rb) if y < x)
        assert row["B better / A better / tied"] == f"{wins} / {losses} / {len(keys) - wins - losses}"
        assert float(row["sign test p"]) == pytest.approx(float(_brute_sign_p(wins, losses)), rel=1e-3)
    flipped = {(k[0], k[1]) for k in shared if (ca[k][0] > 0) != (cb[k][0] > 0)}
    listed = set(re.findall(r"^\| (toyx?)\s+\| (toy-\d+-\d+)\s+\|", md, flags=re.M))
    assert listed == flipped and f"## Flipped questions ({len(flipped)})" in md
    # seeded: the same command prints the same report
    assert run_cmd(["compare", str(runs["A2"]), str(runs["B2"]), "--out", str(tmp_path / "again.md"), "--n-boot", "500"]) == 0
    assert (tmp_path / "again.md").read_text() == md


@pytest.mark.slow
def test_compare_real_runs_and_mismatches(runs, tmp_path, capsys):
    # the real tiny runs: shared questions of C are its 4; n and sampling differences are stated
    assert run_cmd(["compare", str(runs["A"]), str(runs["C"])]) == 0
    out = capsys.readouterr().out
    assert "| toy " in out and "n differs (A 4, B 2)" in out and "sampling differs" in out
    assert "toy: 2 questions only in A, 0 only in B (left out)" in out
    cmp = report.compare_runs(report.load_run(runs["A"]), report.load_run(runs["C"]), n_boot=100)
    assert cmp.pooled.shared == 4 and cmp.pooled.k_pass == 2
    # no shared questions: a one-line error
    other = _relabel(runs["A"], tmp_path / "other", "o", split=False)
    recs = [json.loads(x) for x in (other / "samples.jsonl").read_text().splitlines()]
    for r in recs:
        r["task"]["id"] = "other-" + r["task"]["id"]
    (other / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    cfg = yaml.safe_load((other / "config.yaml").read_text())  # the questions its --limit chose, renamed too
    cfg["question_ids"] = {b: ["other-" + i for i in ids] for b, ids in (cfg.get("question_ids") or {}).items()}
    (other / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    assert run_cmd(["compare", str(runs["A"]), str(other)]) == 2
    assert "share no questions" in capsys.readouterr().out


# ------------------------------------------------------------------------------------ cost


PRICES = {
    "currency": "USD",
    "models": {
        "big-model": {"input_per_1m": 3.0, "output_per_1m": 15.0},
        "small-model": {"input_per_1m": 0.25, "output_per_1m": 1.25, "gpu_hour": 0.5},
    },
}


def _team(path: Path, solver: str, checker: str) -> Path:
    groups = {}
    for price in dict.fromkeys([solver, checker]):
        groups[price] = {"model": "tiny-random", "engine": "hf", "price": price}
    path.write_text(yaml.safe_dump({"workflow": "toy", "worker_groups": groups,
                                    "agents": {"solver": solver, "checker": checker}}))
    return path


@pytest.fixture(scope="module")
def cost_out(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("cost")
    (base / "prices.yaml").write_text(yaml.safe_dump(PRICES))
    _team(base / "all-big.yaml", "big-model", "big-model")
    _team(base / "solver-big-checker-small.yaml", "big-model", "small-model")
    assert run_cmd(_cost_argv(base)) == 0
    return base


def _cost_argv(base: Path) -> list[str]:
    return ["cost", "--team", str(base / "all-big.yaml"), "--team", str(base / "solver-big-checker-small.yaml"),
            "--suite", "toy", "--limit", "4", "--n", "2", "--max-new-tokens", "8", "--prices", str(base / "prices.yaml"),
            "--out", str(base / "study"), "--no-progress"]


def _exact_turn_usd(turn: dict, price: dict) -> Fraction:
    c = turn["completion"]
    return (Fraction(c["prompt_tokens"]) * Fraction(str(price.get("input_per_1m", 0))) / 10**6
            + Fraction(c["completion_tokens"]) * Fraction(str(price.get("output_per_1m", 0))) / 10**6
            + Fraction(str(price.get("gpu_hour", 0))) * Fraction(c["latency_s"]) / 3600)


@pytest.mark.slow
def test_cost_study_breakdowns_add_up_exactly(cost_out):
    study = cost_out / "study"
    for name in ("cost.md", "cost.csv", "cost.json", "pareto.png"):
        assert (study / name).is_file(), name
    assert (study / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    prices = load_prices(cost_out / "prices.yaml")
    runs_ = [report.load_run(study / "runs" / "all-big"), report.load_run(study / "runs" / "solver-big-checker-small")]
    costs = report.cost_study(runs_, prices)
    for c in costs:
        recs = [json.loads(x) for x in (c.run.path / "samples.jsonl").read_text().splitlines()]
        team = yaml.safe_load((c.run.path / "config.yaml").read_text())["identity"]["team"]
        # exact additivity: agents' tokens and dollars sum to the totals
        assert sum(a.prompt_tokens for a in c.agents.values()) == c.prompt_tokens
        assert sum(a.completion_tokens for a in c.agents.values()) == c.completion_tokens
        assert sum((a.usd for a in c.agents.values()), Fraction(0)) == c.usd
        # independent recomputation: tokens exactly, dollars from exact prices (float rounding only)
        by_agent: dict[str, list] = defaultdict(lambda: [0, 0, Fraction(0)])
        for r in recs:
            for t in r["turns"]:
                key = team["worker_groups"][t["wg"]]["price"]
                acc = by_agent[t["agent"]]
                acc[0] += t["completion"]["prompt_tokens"]
                acc[1] += t["completion"]["completion_tokens"]
                acc[2] += _exact_turn_usd(t, PRICES["models"][key])
        for agent, (p, q, usd) in by_agent.items():
            ac = c.agents[agent]
            assert (ac.prompt_tokens, ac.completion_tokens) == (p, q)
            assert float(ac.usd) == pytest.approx(float(usd), rel=1e-12)
        assert c.usd_per_1k == pytest.approx(float(sum(v[2] for v in by_agent.values()) * 1000 / len(recs)), rel=1e-12)
        assert c.trajectories == len(recs) == 8 and c.questions == 4
    # the homogeneous team prices every call as big-model; the heterogeneous one splits by agent
    assert costs[0].agents["checker"].price_keys == ["big-model"]
    assert costs[1].agents["checker"].price_keys == ["small-model"]
    # the CSV written by the command: per-agent lines add up to the total line
    rows = list(csv.DictReader(io.StringIO((study / "cost.csv").read_text())))
    for team in ("all-big", "solver-big-checker-small"):
        agent_rows = [r for r in rows if r["team"] == team and r["agent"] != "total"]
        total = next(r for r in rows if r["team"] == team and r["agent"] == "total")
        for col in ("calls", "prompt_tokens", "completion_tokens"):
            assert sum(int(r[col]) for r in agent_rows) == int(total[col])
        assert math.fsum(float(r["usd"]) for r in agent_rows) == pytest.approx(float(total["usd"]), rel=1e-12)
    md = (study / "cost.md").read_text()
    assert "Per-agent breakdown" in md and "**total**" in md and "Δ $" in md
    # the relative cost column: the heterogeneous team vs the first team
    expect = 100 * (costs[1].usd_per_1k - costs[0].usd_per_1k) / costs[0].usd_per_1k
    assert f"{expect:+.1f}%" in md


@pytest.mark.slow
def test_cost_runs_mode_matches_team_mode(cost_out, tmp_path, capsys):
    study = cost_out / "study"
    assert run_cmd(["cost", "--runs", str(study / "runs"), "--prices", str(cost_out / "prices.yaml"),
                    "--labels", "homogeneous,heterogeneous", "--out", str(tmp_path / "again")]) == 0
    first = json.loads((study / "cost.json").read_text())["teams"]
    again = json.loads((tmp_path / "again" / "cost.json").read_text())["teams"]
    assert [t["label"] for t in again] == ["homogeneous", "heterogeneous"]
    for a, b in zip(first, again):
        assert {k: v for k, v in a.items() if k != "label"} == {k: v for k, v in b.items() if k != "label"}
    # re-running the team mode resumes the evals (nothing is generated again): the same study
    capsys.readouterr()
    assert run_cmd(_cost_argv(cost_out)) == 0
    assert json.loads((study / "cost.json").read_text())["teams"] == first
    assert capsys.readouterr().err.count("0 episodes run, 8 resumed from disk") == 2  # the eval log line (summary.md says it too)


@pytest.mark.slow
def test_cost_errors(cost_out, tmp_path, capsys):
    study = cost_out / "study"
    assert run_cmd(["cost", "--runs", str(study / "runs" / "all-big")]) == 2
    assert "pass --prices" in capsys.readouterr().out
    sheet = tmp_path / "p.yaml"
    sheet.write_text(yaml.safe_dump({"models": {"big-model": {"input_per_1m": 1}}}))
    assert run_cmd(["cost", "--runs", str(study / "runs" / "solver-big-checker-small"), "--prices", str(sheet)]) == 2
    assert "'small-model' has no price" in capsys.readouterr().out
    assert run_cmd(["cost", "--team", str(cost_out / "all-big.yaml"), "--prices", str(sheet), "--out", str(tmp_path)]) == 2
    assert "--team needs --suite" in capsys.readouterr().out


def test_pareto_front():
    pts = [(1.0, 0.5), (2.0, 0.6), (2.0, 0.4), (3.0, 0.6), (0.5, 0.1)]
    assert report.pareto_front(pts) == [4, 0, 1]
    assert report.pareto_front([(0.0, 0.0), (0.0, 0.0)]) == [0, 1]


# ----------------------------------------------------------------------------- assignments


def test_enumerate_assignments():
    got = report.enumerate_assignments(["verifier", "searcher", "answerer"], ["big", "small"])
    assert len(got) == 8 and got[0] == {"verifier": "big", "searcher": "big", "answerer": "big"}
    assert len({tuple(sorted(a.items())) for a in got}) == 8
    assert all(list(a) == ["verifier", "searcher", "answerer"] for a in got)
    assert len(report.enumerate_assignments(["solver"], ["a", "b", "c"])) == 3
    with pytest.raises(UserError, match="named twice"):
        report.enumerate_assignments(["a", "a"], ["m"])


def test_assign_writes_valid_team_files(tmp_path, capsys):
    from drmas_bench.agents.team import team_from_dict

    out = tmp_path / "study"
    assert run_cmd(["cost", "--assign", "verifier,searcher,answerer", "--models",
                    "Qwen/Qwen2.5-7B-Instruct,meta-llama/Llama-3.2-3B-Instruct", "--out", str(out)]) == 0
    files = sorted((out / "teams").glob("*.yaml"))
    assert len(files) == 8
    seen = set()
    for f in files:
        spec = team_from_dict(yaml.safe_load(f.read_text()), ("verifier", "searcher", "answerer"), "search_route")
        assert spec.workflow == "search_route"
        models = tuple(spec.worker_groups[spec.agents[a]].model for a in ("verifier", "searcher", "answerer"))
        seen.add(models)
        assert len(spec.worker_groups) == len(set(models))  # agents on one model share its worker group
    assert len(seen) == 8
    assert run_cmd(["cost", "--assign", "solver,verifier", "--models", "a", "--workflow", "search_route",
                    "--out", str(out)]) == 2


def test_help_has_examples(capsys):
    for cmd in ("leaderboard", "compare", "cost"):
        with pytest.raises(SystemExit) as e:
            run_cmd([cmd, "--help"])
        assert e.value.code == 0
        assert "examples:" in capsys.readouterr().out
