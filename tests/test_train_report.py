"""`drmas-bench train-report RUN`: the training run's page (trainer/reports/page.py).

The fast tests build a training run folder as the trainer and the harness write one: metrics.jsonl
through `runlog.MetricsLog` (values drawn at random, one gap), and each RUN/val/step_N/ an
evaluation run folder of the real math_refine workflow answered by the scripted backend of
scripts/bench_view.py, its summary.json made by `metrics.summarize` (what `drmas-bench eval`
writes). The plotted points are read back from the SVG geometry (inverting the axis) and compared
with those files; the links are resolved against the page's folder. The slow test trains the tiny
recipe for 2 steps, which validates itself (before step 1 and at the last step, real run folders).
"""

from __future__ import annotations

import html
import importlib.util
import json
import math
import random
import re
from pathlib import Path
from urllib.parse import unquote

import pytest
import yaml

from drmas_bench import cli, metrics
from drmas_bench.report.runs import load_run
from drmas_trainer import metric_names as M
from drmas_trainer.reports import page as R
from drmas_trainer.runlog import MetricsLog

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_view", ROOT / "scripts" / "bench_view.py")
B = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(B)

needs_browser = pytest.mark.skipif(B.browser() is None, reason="no headless Chromium (Debian: apt-get install -y chromium)")

AGENTS = ("solver", "verifier")
VAL_QUESTIONS = {0: 2, 3: 8, 6: 5, 9: 4, 12: 5}  # step -> questions: avg@1 0.5, 0.625, 0.8, 0.75, 0.8 (a tie with 6)


def _val_folder(run: Path, step: int, questions: int) -> Path:
    d = B.scripted_math_run(run / "val" / f"step_{step}", questions=questions)
    summary = metrics.summarize(load_run(d).records, workflow="math_refine", n_boot=20)
    (d / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    return d


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("train") / "run"
    rng = random.Random(5)
    log = MetricsLog(d)
    for step in range(1, 13):
        rec = {"step": step, M.SCORE: rng.random(), M.ACC: rng.random()}
        for a in AGENTS:
            rec[M.agent(a, M.GRAD_NORM)] = 10 ** rng.uniform(-2, 1.5)
            rec[M.agent(a, M.VALID)] = rng.random()
        for k in M.PHASES:  # validation's seconds only on the steps that validate
            if k != M.TIME_TESTING or step in VAL_QUESTIONS:
                rec[k] = rng.uniform(0.1, 5.0)
        rec[M.TIME_STEP] = sum(rec.get(k, 0.0) for k in M.PHASES) + rng.uniform(0.0, 1.0)
        if step == 5:
            rec[M.SCORE] = float("nan")  # written as null: a gap in the reward line
        log.write(rec)
    log.close()
    (d / "config.yaml").write_text(yaml.safe_dump({"workflow": "math_refine", "model": "tiny-random",
                                                   "algo": {"estimator": "drmas"}}), encoding="utf-8")
    for step, q in VAL_QUESTIONS.items():
        _val_folder(d, step, q)
    (d / "val" / "step_10").mkdir()  # a validation still running: its config only
    (d / "val" / "step_10" / "config.yaml").write_text((d / "val" / "step_0" / "config.yaml").read_text())
    return d


def _figures(page: str) -> dict[str, dict]:
    """Each chart's axis range and points, the points' (step, value) read back from their position."""
    out = {}
    for name, body in re.findall(r'<figure class="chart" data-chart="([^"]+)">(.*?)</figure>', page, re.DOTALL):
        svg = re.search(r"<svg[^>]*>", body).group(0)
        ax = {k: float(v) for k, v in re.findall(r'data-(x0|x1|y0|y1|log)="([^"]+)"', svg)}
        pts = []
        for attrs, href in _points(body):
            cx, cy = float(attrs["cx"]), float(attrs["cy"])
            step = ax["x0"] + (cx - R.LEFT) / (R.W - R.LEFT - R.RIGHT) * (ax["x1"] - ax["x0"])
            t = ax["y0"] + (1 - (cy - R.TOP) / (R.H - R.TOP - R.BOTTOM)) * (ax["y1"] - ax["y0"])
            pts.append({"series": html.unescape(attrs["data-series"]), "step": step, "value": 10 ** t if ax["log"] else t,
                        "data_step": int(attrs["data-step"]), "data_value": float(attrs["data-value"]), "href": href,
                        "best": "best" in attrs["class"]})
        out[name] = {"axis": ax, "points": pts}
    return out


def _points(svg: str):
    for m in re.finditer(r'(<a class="val-link" href="([^"]*)">)?<circle ([^>]*)>', svg):
        yield dict(re.findall(r'([\w-]+)="([^"]*)"', m.group(3))), (html.unescape(m.group(2)) if m.group(2) else None)


def _series(points, label):
    return {round(p["step"], 6): p["value"] for p in points if p["series"] == label}


def _close(got: dict, want: dict, rel: float = 2e-3) -> None:
    """Same steps; values equal to the SVG's rounding (2 decimals of a 200-unit axis)."""
    assert sorted(got) == pytest.approx(sorted(want), abs=0.01)
    for (gs, gv), (ws, wv) in zip(sorted(got.items()), sorted(want.items())):
        assert gv == pytest.approx(wv, rel=rel, abs=rel), (gs, gv, wv)


# ------------------------------------------------------------------ the page's content, no browser


def test_plotted_points_are_the_logged_metrics_and_the_validation_summaries(run):
    page = R.render(run)
    figs = _figures(page)
    assert list(figs) == ["reward", "validation", "grad-norm", "validity", "phases"]
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    reward = {r["step"]: r[M.SCORE] for r in recs if r[M.SCORE] is not None}
    assert 5 not in reward and len(reward) == 11  # the null reward is a gap, not a 0
    _close(_series(figs["reward"]["points"], "reward"), reward)
    for a in AGENTS:
        assert figs["grad-norm"]["axis"]["log"] == 1
        _close(_series(figs["grad-norm"]["points"], a), {r["step"]: r[M.agent(a, M.GRAD_NORM)] for r in recs}, rel=5e-3)
        _close(_series(figs["validity"]["points"], f"{a}, training"), {r["step"]: r[M.agent(a, M.VALID)] for r in recs})
    summaries = {s: json.loads((run / "val" / f"step_{s}" / "summary.json").read_text()) for s in VAL_QUESTIONS}
    _close(_series(figs["validation"]["points"], "avg@1, all questions"), {s: d["micro"]["avg@n"] for s, d in summaries.items()})
    for a in AGENTS:
        _close(_series(figs["validity"]["points"], f"{a}, validation"),
               {s: d["compliance"]["agents"][a]["valid_rate"] for s, d in summaries.items()})
    for fig in figs.values():  # the exact figure is on each point too, and it is where it is drawn
        for p in fig["points"]:
            assert p["step"] == pytest.approx(p["data_step"], abs=0.01)
            assert p["value"] == pytest.approx(p["data_value"], rel=5e-3, abs=2e-3)


def test_the_phase_chart_draws_each_timer_per_step_and_a_step_without_validation_at_0(run):
    page = R.render(run)
    pts = _figures(page)["phases"]["points"]
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for k in (*M.PHASES, M.TIME_STEP):
        label = "step (all of it)" if k == M.TIME_STEP else k.removeprefix("timing_s/")
        _close(_series(pts, label), {r["step"]: r.get(k, 0.0) for r in recs}, rel=1e-2)


def test_every_validation_point_links_to_its_run_folder(run, tmp_path):
    for out in (run / "train_report.html", tmp_path / "elsewhere" / "page.html"):
        page = R.write_report(run, out).read_text(encoding="utf-8")
        linked = [p for f in _figures(page).values() for p in f["points"] if p["href"]]
        assert {p["data_step"] for p in linked} == set(VAL_QUESTIONS)  # step 10 (unfinished) is not plotted
        for p in linked:
            folder = (out.parent / unquote(p["href"])).resolve()
            assert folder == (run / "val" / f"step_{p['data_step']}").resolve() and (folder / "summary.json").is_file()
        rows = re.findall(r'class="val-row-link" href="([^"]+)"', page)
        assert [(out.parent / unquote(h)).resolve().name for h in rows] == [f"step_{s}" for s in (0, 3, 6, 9, 10, 12)]
        assert all((out.parent / unquote(h)).is_dir() for h in rows)


def test_the_page_names_the_best_step_earliest_of_equals(run):
    page = R.render(run)
    assert re.search(r'<p id="best" data-step="6">Best validation step: <b>6</b>, avg@1 80.0 %', page)
    best = [p for f in _figures(page).values() for p in f["points"] if p["best"]]
    assert [(p["data_step"], p["series"]) for p in best] == [(6, "avg@1, all questions")]
    assert "not plotted: no summary.json yet" in page  # step 10, still running


def test_best_step_is_the_plain_maximum_on_random_inputs():
    rng = random.Random(0)
    for _ in range(200):
        pts = [R.ValPoint(s, Path(f"step_{s}"), avg=rng.choice([None, 0.0, 0.25, 0.5, rng.random()]))
               for s in rng.sample(range(100), rng.randint(0, 8))]
        scored = [p for p in pts if p.avg is not None]
        want = None
        if scored:
            top = max(p.avg for p in scored)
            want = min(p.step for p in scored if p.avg == top)
        got = R.best_step(pts)
        assert (got.step if got else None) == want


def test_grid_steps_are_round_and_cover_the_range():
    rng = random.Random(1)
    for _ in range(500):
        raw = 10 ** rng.uniform(-6, 6)
        step = R.nice_step(raw)
        mantissa = step / 10 ** math.floor(math.log10(step) + 1e-12)
        assert raw <= step * (1 + 1e-9) < 2.5 * raw and any(math.isclose(mantissa, m) for m in (1, 2, 2.5, 5))


def test_a_chart_with_nothing_logged_draws_its_empty_box():
    svg = R.line_chart("grad-norm", "t", [R.Series("solver", "#000", [(1, None, None)])], "y", log=True)
    assert "nothing logged" in svg and 'data-log="0"' in svg


def test_a_run_without_validation_says_so(tmp_path, capsys):
    d = tmp_path / "noval"
    log = MetricsLog(d)
    for step in (1, 2):
        log.write({"step": step, M.SCORE: 0.1 * step, M.agent("solver", M.GRAD_NORM): 0.0})  # a zero norm: linear axis
    log.close()
    assert cli.main(["train-report", str(d)]) == 0
    assert "no validation step" in capsys.readouterr().out
    page = (d / "train_report.html").read_text(encoding="utf-8")
    assert '<p id="best" data-step="">This run has no validation folders' in page
    figs = _figures(page)
    assert figs["grad-norm"]["axis"]["log"] == 0 and len(figs["grad-norm"]["points"]) == 2
    assert figs["validation"]["points"] == [] and "nothing logged" in page


def test_what_is_not_a_training_run_is_one_line(tmp_path, run, capsys):
    cases = [
        ([str(tmp_path / "nowhere")], "no such folder"),
        ([str(tmp_path)], "not a training run (no metrics.jsonl)"),
        ([str(run / "val" / "step_0")], "an evaluation run, not a training run; its page is `drmas-bench view"),
        ([str(run), "--out", str(tmp_path / "page.txt")], "ending in .html"),
    ]
    for args, said in cases:
        assert cli.main(["train-report", *args]) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_the_help_has_an_example(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train-report", "--help"])
    assert "drmas-bench train-report runs/" in capsys.readouterr().out


# ------------------------------------------------------------------ in the browser


@needs_browser
def test_the_page_in_chromium(run):
    page = R.write_report(run)
    res = B.open_page(page, size="1300,1400")
    assert res["errors"] == [] and res["console"] == [], res["console"]
    charts = {c[0]: c[1:] for c in res["charts"]}
    n_val, n_steps = len(VAL_QUESTIONS), 12
    assert charts["reward"] == [2 * n_steps - 1, 0, 2]  # reward (a gap at step 5) and its 5-step mean (none)
    assert charts["validation"] == [n_val + n_steps, n_val, 2]  # avg@1 (linked) and the training accuracy
    assert charts["grad-norm"] == [2 * n_steps, 0, 2]
    assert charts["validity"] == [2 * (n_steps + n_val), 2 * n_val, 4]
    assert res["best"] == "6" and res["rows"] == len(VAL_QUESTIONS) + 1
    folders = {Path(unquote(u.removeprefix("file://"))) for u in res["links"]}
    assert folders == {run.resolve() / "val" / f"step_{s}" for s in (*VAL_QUESTIONS, 10)}
    assert all(f.is_dir() for f in folders)
    assert res["scroll_width"] <= res["inner_width"]


# ------------------------------------------------------------------ a real training run


@pytest.mark.slow
def test_a_tiny_training_run_and_its_own_validations(tmp_path, capsys):
    run = tmp_path / "tiny"
    small = ["sft.steps=0", "sft.agent_steps={}", "rollout.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=4",
             "data.size=40", "agent_defaults.micro_batch_size=16", "save_every=1",
             "val.limit=2", "val.n=2"]  # the trainer validates before step 1 and at the last: val/step_0, val/step_2
    assert cli.main(["train", "--recipe", "tiny", "--steps", "2", "--out", str(run), "--no-progress", "--local",
                     *[x for s in small for x in ("--set", s)]]) == 0
    capsys.readouterr()
    assert cli.main(["train-report", str(run)]) == 0
    assert "best validation step" in capsys.readouterr().out
    page = (run / "train_report.html").read_text(encoding="utf-8")
    figs = _figures(page)
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    recs = [r for r in recs if M.SCORE in r]  # step 0's line is its validation alone
    _close(_series(figs["reward"]["points"], "reward"), {r["step"]: r[M.SCORE] for r in recs})
    for a in ("solver", "checker"):
        _close(_series(figs["grad-norm"]["points"], a), {r["step"]: r[M.agent(a, M.GRAD_NORM)] for r in recs}, rel=5e-3)
    summaries = {s: json.loads((run / "val" / f"step_{s}" / "summary.json").read_text()) for s in (0, 2)}
    _close(_series(figs["validation"]["points"], "avg@2, all questions"), {s: d["micro"]["avg@n"] for s, d in summaries.items()})
    best = R.best_step(R.validation_points(run))
    assert best is not None and f'<p id="best" data-step="{best.step}">' in page
    for p in (p for f in figs.values() for p in f["points"] if p["href"]):
        assert (run / unquote(p["href"]) / "summary.json").is_file()
    if B.browser() is not None:
        res = B.open_page(run / "train_report.html")
        assert res["errors"] == [] and res["console"] == [] and [c[0] for c in res["charts"]] == list(figs)
        assert not math.isnan(float(res["best"]))
