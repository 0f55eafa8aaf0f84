"""Reports over run directories: leaderboards, paired comparisons and cost studies.

Everything here reads what `drmas-bench eval` wrote (``config.yaml`` + ``samples.jsonl``) and
recomputes its numbers from the recorded trajectories; nothing trusts a stale ``summary.json``.

- **Leaderboards** (`build_leaderboard`): one table per (suite, metric); rows are runs (plus the
  paper's *reported* rows from ``leaderboards/reference/paper.yaml``), columns are benchmarks, the
  micro average (every question weighted equally) and the macro average (mean of benchmarks).
  ``avg@K`` needs a run with exactly K samples per question, else avg@n is shown and flagged;
  ``pass@K`` uses the unbiased estimator for K <= n and is left empty (and flagged) for K > n.
  Runs whose n or sampling settings differ from the table's usual ones are flagged in a notes column.
- **Comparisons** (`compare_runs`): two runs on their shared questions (same benchmark + task id):
  differences in avg@n and pass@n with a seeded paired bootstrap CI, an exact two-sided sign test
  over the questions whose success rate differs, and the questions that flipped.
- **Cost studies** (`cost_study`): accuracy, latency, tokens and dollars per team, recomputed from
  each turn's recorded tokens with a price sheet and the turn's worker-group model; per-agent
  breakdowns that add up exactly (dollars are summed as exact fractions of the per-call floats);
  a Pareto plot (`plot_pareto`); and `enumerate_assignments` for "which agent gets the big model?".

See docs/leaderboards.md and docs/cost.md.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import re
import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import yaml

from drmas_bench.metrics import MACRO, MICRO, pass_at_k, pass_at_n
from drmas_bench.types import UserError
from drmas_bench.yamlfile import read_yaml

# the evaluation protocol of the paper (REFERENCE.md §3), quoted in table captions
PAPER_PROTOCOL = {"n": 16, "temperature": 0.6, "top_p": 0.95}
SAMPLING_KEYS = ("temperature", "top_p", "max_new_tokens")
PAPER_FILE = Path("leaderboards") / "reference" / "paper.yaml"
PAPER_STATUS = "reported in paper, not reproduced"


# ====================================================================================== runs


@dataclass
class Run:
    """One run directory, read back: its configuration, its records and labels derived from them."""

    path: Path
    name: str
    config: dict[str, Any]
    records: list[dict[str, Any]]
    suite: str
    workflow: str
    n: int  # samples per question the run was configured with
    benchmarks: list[str]
    team: dict[str, Any]  # config identity.team (TeamSpec.to_dict)
    sampling: dict[str, dict[str, Any]]  # agent -> {temperature, top_p, max_new_tokens}
    seed: Any = None
    estimator: str | None = None  # from a trained team's team.yaml (`trained:`), when known
    step: Any = None

    @property
    def agents(self) -> list[str]:
        return list((self.team.get("agents") or {}).keys())

    def wg_model(self, wg: str) -> str:
        g = (self.team.get("worker_groups") or {}).get(wg)
        if isinstance(g, str):
            return g
        return str(g.get("model", wg)) if isinstance(g, dict) else wg

    def price_key(self, wg: str) -> str:
        """The price-sheet key of a worker group: its `price`, else its model's base name
        (the same rule as `WorkerGroupSpec.price_key`); an unknown group is priced by its name."""
        g = (self.team.get("worker_groups") or {}).get(wg)
        if isinstance(g, dict) and g.get("price"):
            return str(g["price"])
        if g is None:
            return wg
        return Path(self.wg_model(wg).rstrip("/")).name

    def agent_wg(self, agent: str) -> str | None:
        v = (self.team.get("agents") or {}).get(agent)
        return v.get("wg") if isinstance(v, dict) else v

    @property
    def model_label(self) -> str:
        """One model name, or `agent:model` groups when the agents' models differ."""
        by_model: dict[str, list[str]] = {}
        for a in self.agents:
            wg = self.agent_wg(a)
            by_model.setdefault(_short(self.wg_model(wg)) if wg else "?", []).append(a)
        if len(by_model) == 1:
            return next(iter(by_model))
        return "; ".join(f"{'/'.join(ags)}: {m}" for m, ags in by_model.items())

    @property
    def team_label(self) -> str:
        """shared (one worker group), non-shared (one per agent) or `K groups`; + heterogeneous."""
        wgs = {self.agent_wg(a) for a in self.agents}
        models = {self.wg_model(w) for w in wgs if w}
        if len(wgs) <= 1:
            kind = "shared"
        elif len(wgs) == len(self.agents):
            kind = "non-shared"
        else:
            kind = f"{len(wgs)} groups"
        return kind + (", heterogeneous" if len(models) > 1 else "")

    @property
    def sampling_signature(self) -> tuple:
        """The distinct (temperature, top_p, max_new_tokens) settings of the run's agents."""
        return tuple(sorted({tuple(s.get(k) for k in SAMPLING_KEYS) for s in self.sampling.values()}, key=str))

    @property
    def sampling_label(self) -> str:
        parts = []
        for t, p, m in self.sampling_signature:
            parts.append(f"T={_num(t)} top_p={_num(p)} max={m}")
        return " | ".join(parts) if parts else "–"


def _short(model: str) -> str:
    return Path(str(model).rstrip("/")).name or str(model)


def _num(x: Any) -> str:
    return f"{x:g}" if isinstance(x, (int, float)) and not isinstance(x, bool) else str(x)


def read_samples(path: Path) -> list[dict[str, Any]]:
    """Every record of a samples.jsonl (the last copy of a repeated key wins, as in the store).

    A trailing partial line (a run killed mid-append) is ignored; any other bad line is an error."""
    if not path.is_file():
        raise UserError(f"{path} not found: not a finished or started run directory")
    by_key: dict[tuple, dict[str, Any]] = {}
    lines = path.read_text(encoding="utf-8").split("\n")
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            key = (rec["task"]["benchmark"], str(rec["task"]["id"]), int(rec["sample_idx"]))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            if lineno == len(lines):  # a cut-off last line: the run was killed while appending
                continue
            raise UserError(f"{path}:{lineno}: not a trajectory record") from None
        by_key[key] = rec
    return list(by_key.values())


def _trained_info(config: dict[str, Any], run_path: Path) -> tuple[str | None, Any]:
    """(estimator, step) from a trained team's `trained:` block, when the run names one.

    Looked up in the config's identity.team, then in `team.yaml` beside a `--model DIR` or a
    `--team FILE` of the run's argv, then in the folders above the worker groups' models."""
    team = (config.get("identity") or {}).get("team") or {}
    cands: list[dict[str, Any]] = []
    if isinstance(team.get("trained"), dict):
        cands.append(team["trained"])
    argv = [str(a) for a in config.get("argv") or []]
    files: list[Path] = []
    for flag, is_dir in (("--model", True), ("--team", False)):
        for i, a in enumerate(argv):
            val = argv[i + 1] if a == flag and i + 1 < len(argv) else (a.split("=", 1)[1] if a.startswith(flag + "=") else None)
            if val:
                files.append(Path(val) / "team.yaml" if is_dir else Path(val))
    for g in (team.get("worker_groups") or {}).values():
        model = g.get("model") if isinstance(g, dict) else g
        if model and Path(str(model)).is_dir():  # a checkpoint folder (not an alias or a hub id)
            files += [Path(str(model)) / "team.yaml", Path(str(model)).parent / "team.yaml"]
    for f in files:
        try:
            if f.is_file():
                d = yaml.safe_load(f.read_text(encoding="utf-8"))
                if isinstance(d, dict) and isinstance(d.get("trained"), dict):
                    cands.append(d["trained"])
        except (OSError, yaml.YAMLError):
            continue
    for t in cands:
        est = t.get("estimator") or t.get("advantage")
        step = t.get("step", t.get("global_step"))
        if est is not None or step is not None:
            return (str(est) if est is not None else None), step
    return None, None


def load_run(path: str | Path) -> Run:
    """Read a run directory written by `drmas-bench eval`.

    Only records of the configured benchmarks with sample_idx < the configured n count (a run
    dir that was first evaluated with a larger n keeps the extra samples on disk)."""
    p = Path(path)
    cfg_path = p / "config.yaml"
    if not cfg_path.is_file():
        raise UserError(f"{p}: not a run directory (no config.yaml); make one with `drmas-bench eval --out {p}`")
    try:
        config = yaml.safe_load(cfg_path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise UserError(f"{cfg_path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(config, dict) or "identity" not in config:
        raise UserError(f"{cfg_path}: not a run config (no `identity`)")
    n = int(config.get("n") or 0)
    benches = [str(b) for b in config.get("benchmarks") or []]
    records = [r for r in read_samples(p / "samples.jsonl")
               if (not benches or r["task"]["benchmark"] in benches) and (n <= 0 or int(r["sample_idx"]) < n)]
    if not records:
        raise UserError(f"{p}: the run has no finished samples yet")
    ident = config["identity"]
    sampling = {a: {k: s.get(k) for k in SAMPLING_KEYS} for a, s in (ident.get("sampling") or {}).items()}
    estimator, step = _trained_info(config, p)
    return Run(path=p, name=p.name or str(p), config=config, records=records, suite=str(config.get("suite", "?")),
               workflow=str(config.get("workflow", "?")), n=n or max(int(r["sample_idx"]) for r in records) + 1,
               benchmarks=benches or sorted({r["task"]["benchmark"] for r in records}),
               team=ident.get("team") or {}, sampling=sampling, seed=ident.get("seed"),
               estimator=estimator, step=step)


def expand_run_dirs(paths: Iterable[str | Path]) -> list[Path]:
    """Run directories from the arguments: a run dir itself, or a folder whose sub-folders are run dirs."""
    out: list[Path] = []
    for a in paths:
        p = Path(a)
        if (p / "config.yaml").is_file():
            out.append(p)
        elif p.is_dir() and (subs := sorted(d for d in p.iterdir() if (d / "config.yaml").is_file())):
            out.extend(subs)
        else:
            raise UserError(f"{p}: not a run directory (no config.yaml), nor a folder of run directories")
    return out


def load_runs(paths: Iterable[str | Path]) -> list[Run]:
    """`load_run` over `expand_run_dirs`, giving runs with the same folder name distinct names."""
    runs = [load_run(p) for p in expand_run_dirs(paths)]
    counts = Counter(r.name for r in runs)
    for r in runs:
        if counts[r.name] > 1:
            r.name = str(r.path)
    return runs


# ================================================================================= questions


@dataclass(frozen=True)
class Question:
    """Per-question success counts: c successes among n samples."""

    benchmark: str
    id: str
    n: int
    c: int
    text: str = ""


def questions(records: Iterable[dict[str, Any]]) -> dict[tuple[str, str], Question]:
    """(benchmark, task id) -> Question, from trajectory records; sorted by (benchmark, task id), so
    what is computed from them (bootstrap CIs included) does not depend on the order of the records."""
    acc: dict[tuple[str, str], list] = {}
    for r in records:
        t = r["task"]
        key = (str(t["benchmark"]), str(t["id"]))
        slot = acc.setdefault(key, [0, 0, str(t.get("question", ""))])
        slot[0] += 1
        slot[1] += bool(r.get("correct", False))
    return {k: Question(k[0], k[1], v[0], v[1], v[2]) for k, v in sorted(acc.items())}


# =================================================================================== metrics


@dataclass(frozen=True)
class Metric:
    """`avg@K` / `pass@K`; K = None means the run's own n (`avg@n`, `pass@n`)."""

    kind: str  # "avg" | "pass"
    k: int | None = None

    @property
    def name(self) -> str:
        return f"{self.kind}@{'n' if self.k is None else self.k}"


def parse_metrics(text: str) -> list[Metric]:
    """`avg@16,pass@16` -> metrics; K is a positive integer or `n`. Bad names are UserErrors."""
    out: list[Metric] = []
    for part in [p.strip() for p in str(text).split(",") if p.strip()]:
        m = re.fullmatch(r"(avg|pass)@(n|\d+)", part.lower())
        if not m or (m.group(2) != "n" and int(m.group(2)) == 0):
            raise UserError(f"--metric: {part!r} is not a metric; use avg@K or pass@K with K a positive integer or n "
                            "(e.g. avg@16,pass@16)")
        metric = Metric(m.group(1), None if m.group(2) == "n" else int(m.group(2)))
        if metric not in out:
            out.append(metric)
    if not out:
        raise UserError("--metric: name at least one metric, e.g. avg@n,pass@n")
    return out


def per_question_values(qs: Sequence[Question], metric: Metric, run_n: int) -> tuple[np.ndarray | None, str, str | None]:
    """The metric's per-question values for one run's questions, the label actually computed, and a
    flag when it differs from what was asked (or None when it cannot be computed: values None)."""
    n_min = min(q.n for q in qs)
    if metric.kind == "avg":
        label = f"avg@{run_n}" if n_min == run_n else f"avg@{n_min}..{run_n}"
        flag = None
        if metric.k is not None and not (metric.k == run_n and n_min == run_n):
            flag = f"{metric.name} asked but n={run_n}" + ("" if n_min == run_n else f" (some questions only {n_min})") + \
                   f": shows avg@n = {label}"
        return np.array([q.c / q.n for q in qs], dtype=float), label, flag
    if metric.k is None:  # pass@n: any success among each question's own samples (metrics.pass_at_n)
        n_max = max(q.n for q in qs)
        flag = None
        if n_min != n_max or n_min != run_n:
            flag = (f"uneven samples per question ({n_min}..{n_max}, n={run_n}): pass@n = any-success rate "
                    "over the samples present")
        label = f"pass@{run_n}" if flag is None else f"pass@{n_min}..{n_max}"
        return np.array([pass_at_n(q.n, q.c) for q in qs], dtype=float), label, flag
    k = metric.k
    if k > n_min:
        return None, metric.name, f"{metric.name} needs at least {k} samples per question; run has n={n_min}"
    return np.array([pass_at_k(q.n, q.c, k) for q in qs], dtype=float), f"pass@{k}", None


def bootstrap_mean_ci(strata: Sequence[np.ndarray], n_boot: int = 1000, seed: int = 0,
                      level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap CI of the unweighted mean of stratum means (one stratum: a plain mean),
    resampling each stratum's values with replacement; seeded, chunked to bound memory."""
    strata = [np.asarray(s, dtype=float) for s in strata if len(s)]
    if not strata:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    stats = np.empty(n_boot)
    total = sum(len(s) for s in strata)
    block = max(1, 2_000_000 // total)
    for start in range(0, n_boot, block):
        b = min(block, n_boot - start)
        means = [s[rng.integers(0, len(s), size=(b, len(s)))].mean(axis=1) for s in strata]
        stats[start:start + b] = np.mean(means, axis=0)
    alpha = (1 - level) / 2
    return float(np.quantile(stats, alpha)), float(np.quantile(stats, 1 - alpha))


def _seed(name: str, seed: int) -> int:
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**32)


# ============================================================================== leaderboards


@dataclass
class Cell:
    value: float | None  # a fraction in [0, 1] (rendered in %)
    ci: tuple[float, float] | None = None


@dataclass
class Row:
    label: str
    source: str  # "reproduced" | "reported"
    model: str = "–"
    team: str = "–"
    estimator: str = "–"
    step: str = "–"
    n: str = "–"
    sampling: str = "–"
    cells: dict[str, Cell] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    path: str = ""


@dataclass
class Table:
    suite: str
    metric: str
    columns: list[str]  # benchmarks, then MICRO, MACRO
    rows: list[Row]
    caption: str = ""


def _suite_order(suite: str) -> list[str]:
    try:
        from drmas_bench.tasks import select_benchmarks

        return [b.name for b in select_benchmarks(suite, None)]
    except Exception:  # an unknown suite: keep the runs' own order
        return []


def run_row(run: Run, metric: Metric, ci: bool, n_boot: int, seed: int) -> Row:
    """One leaderboard row for a run: per-benchmark, micro and macro values of `metric`."""
    qs = questions(run.records)
    by_bench: dict[str, list[Question]] = defaultdict(list)
    for q in qs.values():
        by_bench[q.benchmark].append(q)
    row = Row(label=run.name, source="reproduced", model=run.model_label, team=run.team_label,
              estimator=run.estimator or "–", step="–" if run.step is None else str(run.step), n=str(run.n),
              sampling=run.sampling_label, path=str(run.path))
    flags: list[str] = []
    values: dict[str, np.ndarray] = {}
    for b in sorted(by_bench, key=lambda b: (run.benchmarks.index(b) if b in run.benchmarks else 99, b)):
        vals, _label, flag = per_question_values(by_bench[b], metric, run.n)
        if flag and flag not in flags:
            flags.append(flag)
        if vals is None:
            row.cells[b] = Cell(None)
            continue
        values[b] = vals
        cell = Cell(float(vals.mean()))
        if ci:
            cell.ci = bootstrap_mean_ci([vals], n_boot, _seed(metric.name, seed))
        row.cells[b] = cell
    if values and len(values) == len(by_bench):
        pooled = np.concatenate(list(values.values()))
        micro = Cell(float(pooled.mean()))
        macro = Cell(float(np.mean([v.mean() for v in values.values()])))
        if ci:
            micro.ci = bootstrap_mean_ci([pooled], n_boot, _seed(metric.name, seed))
            macro.ci = bootstrap_mean_ci(list(values.values()), n_boot, _seed(metric.name, seed))
        row.cells[MICRO], row.cells[MACRO] = micro, macro
    else:
        row.cells[MICRO] = row.cells[MACRO] = Cell(None)
    missing = [b for b in run.benchmarks if b not in by_bench]
    if missing:
        flags.append(f"no samples for {', '.join(missing)}")
    incomplete = sum(1 for q in qs.values() if q.n < run.n)
    if incomplete:
        flags.append(f"{incomplete} questions have fewer than n={run.n} samples (run unfinished?)")
    row.notes = flags
    return row


def load_paper(path: str | Path | None = None, required: bool = False) -> dict[str, Any] | None:
    """The reported rows (leaderboards/reference/paper.yaml). Without a path: the repository's copy
    (beside the installed package in a checkout), else ./leaderboards/reference/paper.yaml; None
    when neither exists and `required` is False."""
    if path is None:
        cands = [Path(__file__).resolve().parent.parent / PAPER_FILE, Path.cwd() / PAPER_FILE]
        found = next((c for c in cands if c.is_file()), None)
        if found is None:
            if required:
                raise UserError(f"{PAPER_FILE} not found; pass --paper FILE")
            return None
        path = found
    return validate_paper(read_yaml(path, "paper reference file"), str(path))


_PAPER_TOP = {"source", "status", "protocol", "rows", "cost_studies", "claims", "note"}
_PAPER_ROW = {"suite", "label", "model", "team", "estimator", "n", "where", "values", "note"}


def validate_paper(data: Any, where: str = "paper.yaml") -> dict[str, Any]:
    """Check the reference file's shape; every problem is a one-line UserError naming the key."""
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise UserError(f"{where}: expected a mapping with a `rows:` list")
    for k in data:
        if k not in _PAPER_TOP:
            raise UserError(f"{where}: unknown key {k!r} (known: {', '.join(sorted(_PAPER_TOP))})")
    for i, row in enumerate(data["rows"]):
        w = f"{where}: rows[{i}]"
        if not isinstance(row, dict):
            raise UserError(f"{w}: expected a mapping")
        for k in row:
            if k not in _PAPER_ROW:
                raise UserError(f"{w}: unknown key {k!r} (known: {', '.join(sorted(_PAPER_ROW))})")
        for k in ("suite", "label", "where", "values"):
            if k not in row:
                raise UserError(f"{w}: missing `{k}`")
        if not isinstance(row["values"], dict):
            raise UserError(f"{w}.values: expected metric -> {{benchmark: number}}")
        for metric, cols in row["values"].items():
            parse_metrics(metric)
            if not isinstance(cols, dict):
                raise UserError(f"{w}.values.{metric}: expected benchmark -> number (percent)")
            for col, v in cols.items():
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 100:
                    raise UserError(f"{w}.values.{metric}.{col}: expected a percentage in [0, 100], got {v!r}")
    return data


def paper_rows(paper: dict[str, Any], suite: str, metric: Metric) -> list[Row]:
    """The reported rows of one suite that state a number for `metric`.

    A table of `avg@n` / `pass@n` takes the paper's avg@N / pass@N at the row's stated n. The paper's
    `average` (over its benchmarks) goes into the macro column."""
    out = []
    for r in paper.get("rows", []):
        if r["suite"] != suite:
            continue
        n = r.get("n")
        vals = None
        for name, cols in r["values"].items():
            m = parse_metrics(name)[0]
            if m == metric or (metric.k is None and m.kind == metric.kind and m.k == n):
                vals = cols
                break
        if not vals:
            continue
        row = Row(label=f"[paper] {r['label']}", source="reported", model=str(r.get("model", "–")),
                  team=str(r.get("team", "–")), estimator=str(r.get("estimator", "–")), step="–",
                  n="–" if n is None else str(n),
                  sampling=f"T={_num(paper.get('protocol', {}).get('temperature', '?'))} "
                           f"top_p={_num(paper.get('protocol', {}).get('top_p', '?'))}" if paper.get("protocol") else "–")
        for col, v in vals.items():
            key = MACRO if col == "average" else col
            row.cells[key] = Cell(float(v) / 100.0)
        row.notes.append(f"{paper.get('status', PAPER_STATUS)} ({r['where']})")
        if "average" in vals:
            row.notes.append("the paper's average over its benchmarks, shown as macro")
        if r.get("note"):
            row.notes.append(str(r["note"]))
        out.append(row)
    return out


def _flag_settings(rows_runs: list[tuple[Row, Run]]) -> None:
    """Add notes to rows whose n or sampling differ from the table's setting: the most common one
    among its runs (a tie goes to the earliest run)."""
    if len(rows_runs) < 2:
        return
    ns = Counter(run.n for _, run in rows_runs)
    sig = Counter(run.sampling_signature for _, run in rows_runs)
    usual_n = max(ns, key=lambda v: (ns[v], -[r.n for _, r in rows_runs].index(v)))
    sigs = [r.sampling_signature for _, r in rows_runs]
    usual_sig = max(sig, key=lambda v: (sig[v], -sigs.index(v)))
    for row, run in rows_runs:
        if run.n != usual_n:
            row.notes.insert(0, f"n={run.n} differs (table: n={usual_n})")
        if run.sampling_signature != usual_sig:
            diffs = []
            for i, key in enumerate(SAMPLING_KEYS):
                mine = sorted({s[i] for s in run.sampling_signature}, key=str)
                usual = sorted({s[i] for s in usual_sig}, key=str)
                if mine != usual:
                    diffs.append(f"{key} {'/'.join(map(_num, mine))} (table: {'/'.join(map(_num, usual))})")
            row.notes.insert(0, "sampling differs: " + ", ".join(diffs))


def build_leaderboard(runs: Sequence[Run], metrics: Sequence[Metric], ci: bool = False,
                      paper: dict[str, Any] | None = None, n_boot: int = 1000, seed: int = 0) -> list[Table]:
    """One Table per (suite, metric), suites in order of first appearance, runs in the given order,
    the paper's reported rows (when `paper` is given) last."""
    suites: dict[str, list[Run]] = {}
    for r in runs:
        suites.setdefault(r.suite, []).append(r)
    tables = []
    for suite, srs in suites.items():
        order = _suite_order(suite)
        seen = {b for r in srs for b in r.benchmarks} | {q["task"]["benchmark"] for r in srs for q in r.records}
        cols = [b for b in order if b in seen] + sorted(seen - set(order))
        for metric in metrics:
            rows_runs = [(run_row(r, metric, ci, n_boot, seed), r) for r in srs]
            _flag_settings(rows_runs)
            for row, r in rows_runs:
                if len(srs) > 1 and [b for b in cols if b in r.benchmarks] != cols:
                    row.notes.append(f"covers {len(r.benchmarks)} of {len(cols)} benchmarks: micro/macro over its own")
            rows = [row for row, _ in rows_runs]
            reported = [r for r in (paper_rows(paper, suite, metric) if paper else [])
                        if any(c in cols or c == MACRO for c in r.cells)]  # a number to show here
            p = {**PAPER_PROTOCOL, **((paper or {}).get("protocol") or {})}
            if reported:
                for row, r in rows_runs:
                    diff = [f"n={r.n}"] if r.n != p["n"] else []
                    for key in ("temperature", "top_p"):
                        mine = sorted({s.get(key) for s in r.sampling.values()}, key=str)
                        if mine != [p[key]]:
                            diff.append(f"{key} {'/'.join(map(_num, mine))}")
                    if diff:
                        row.notes.append(f"not the paper's protocol ({', '.join(diff)})")
            rows += reported
            caption = (f"{suite} suite, {metric.name}; values in %, {MICRO} = every question weighted equally, "
                       f"{MACRO} = unweighted mean over the row's benchmarks"
                       + ("; notes flag runs whose n or sampling differ from the table's setting (the most common "
                          "among its runs, ties: the first run)" if len(srs) > 1 else "")
                       + (f"; [lo, hi] = 95% bootstrap CI over questions ({n_boot} resamples, seed {seed})" if ci else "")
                       + (f". Rows marked [paper] are {PAPER_STATUS}; the paper's protocol: n={p['n']}, "
                          f"temperature {p['temperature']}, top_p {p['top_p']}" if reported else ""))
            tables.append(Table(suite=suite, metric=metric.name, columns=cols + [MICRO, MACRO], rows=rows, caption=caption))
    return tables


def _pct(x: float | None, digits: int = 1) -> str:
    return "–" if x is None or x != x else f"{100 * x:.{digits}f}"


def _cell_text(c: Cell | None, ci: bool) -> str:
    if c is None or c.value is None:
        return "–"
    if ci and c.ci is not None and all(v == v for v in c.ci):
        return f"{_pct(c.value)} [{_pct(c.ci[0])}, {_pct(c.ci[1])}]"
    return _pct(c.value)


def table_markdown(t: Table, ci: bool = False) -> str:
    """A Table as a Markdown section (heading, caption, tabulate github table)."""
    from tabulate import tabulate

    head = ["run", "model", "team", "estimator", "step", "n", "sampling"] + t.columns + ["notes"]
    body = [[r.label, r.model, r.team, r.estimator, r.step, r.n, r.sampling]
            + [_cell_text(r.cells.get(c), ci) for c in t.columns] + ["; ".join(r.notes) or "–"] for r in t.rows]
    return "\n".join([f"## {t.suite}: {t.metric}", "", f"{t.caption}.", "",
                      tabulate(body, head, tablefmt="github", disable_numparse=True)]) + "\n"


def tables_csv(tables: Sequence[Table], ci: bool = False) -> str:
    """Tables of one suite as CSV: one line per (metric, row); values in % (6 decimals), empty = none."""
    cols: list[str] = []
    for t in tables:
        cols += [c for c in t.columns if c not in cols]
    head = ["suite", "metric", "source", "run", "path", "model", "team", "estimator", "step", "n", "sampling"]
    for c in cols:
        head += [c] + ([f"{c} ci_lo", f"{c} ci_hi"] if ci else [])
    head.append("notes")
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(head)
    fmt = lambda v: "" if v is None or v != v else f"{100 * v:.6f}"  # noqa: E731
    for t in tables:
        for r in t.rows:
            line = [t.suite, t.metric, r.source, r.label, r.path, r.model, r.team, r.estimator, r.step, r.n, r.sampling]
            for c in cols:
                cell = r.cells.get(c)
                line.append(fmt(cell.value) if cell else "")
                if ci:
                    line += [fmt(cell.ci[0]), fmt(cell.ci[1])] if cell and cell.ci else ["", ""]
            line.append("; ".join(r.notes))
            w.writerow(line)
    return buf.getvalue()


_SAFE_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def data_file_name(out: str | Path, name: str, suffix: str, where: str) -> Path:
    """``out/<name><suffix>`` for a ``name`` read from a run's files (data, not a flag): it must be
    ``[A-Za-z0-9_.-]+`` without ``..``, and the path must stay directly inside ``out``; otherwise a
    UserError naming ``where`` (e.g. "suite of run X") and the value."""
    ok = bool(_SAFE_NAME.fullmatch(name)) and ".." not in name
    path = Path(out) / f"{name}{suffix}"
    if not ok or path.resolve().parent != Path(out).resolve():
        raise UserError(f"{where} is {name!r}, which cannot name an output file (allowed: letters, digits, "
                        f"'_', '.', '-', no '..'); fix the run's config.yaml")
    return path


def suite_csv_paths(out: str | Path, tables: Sequence[Table], runs: Sequence[Run] = ()) -> dict[str, Path]:
    """``{suite: out/<suite>.csv}`` for every suite of ``tables``, all checked before anything is
    written (a suite comes from a run's config.yaml; see `data_file_name`)."""
    paths: dict[str, Path] = {}
    for suite in dict.fromkeys(t.suite for t in tables):
        owners = [r.name for r in runs if r.suite == suite]
        where = f"the suite of run {owners[0]}" if owners else "a suite"
        paths[suite] = data_file_name(out, suite, ".csv", where)
    return paths


def leaderboard_markdown(tables: Sequence[Table], ci: bool = False) -> str:
    return "# Leaderboard\n\n" + "\n".join(table_markdown(t, ci) for t in tables)


# =============================================================================== comparisons


@dataclass
class Flip:
    benchmark: str
    id: str
    question: str
    a: tuple[int, int]  # (c, n) in run A
    b: tuple[int, int]

    @property
    def direction(self) -> str:
        return "B only" if self.b[0] > 0 else "A only"


@dataclass
class PairedResult:
    """One benchmark (or all shared questions pooled) in a paired comparison. Differences are B - A."""

    name: str
    shared: int
    only_a: int
    only_b: int
    k_pass: int
    avg_a: float
    avg_b: float
    avg_ci: tuple[float, float]
    pass_a: float
    pass_b: float
    pass_ci: tuple[float, float]
    b_better: int  # questions where B's success rate is higher
    a_better: int
    ties: int
    sign_p: float
    flips: list[Flip] = field(default_factory=list)

    @property
    def avg_diff(self) -> float:
        return self.avg_b - self.avg_a

    @property
    def pass_diff(self) -> float:
        return self.pass_b - self.pass_a


def sign_test_p(wins: int, losses: int) -> float:
    """Exact two-sided sign test: P(|X - m/2| >= |wins - m/2|) for X ~ Binomial(m = wins + losses, 1/2)."""
    m = wins + losses
    if m == 0:
        return 1.0
    lo = min(wins, losses)
    tail = sum(math.comb(m, i) for i in range(lo + 1))
    return float(min(Fraction(1), Fraction(2 * tail, 2**m)))


def _paired(name: str, qa: list[Question], qb: list[Question], only_a: int, only_b: int,
            n_boot: int, seed: int) -> PairedResult:
    k = min(min(q.n for q in qa), min(q.n for q in qb))
    ra = np.array([q.c / q.n for q in qa])
    rb = np.array([q.c / q.n for q in qb])
    pa = np.array([pass_at_k(q.n, q.c, k) for q in qa])
    pb = np.array([pass_at_k(q.n, q.c, k) for q in qb])
    b_better = sum(1 for x, y in zip(qa, qb) if Fraction(y.c, y.n) > Fraction(x.c, x.n))
    a_better = sum(1 for x, y in zip(qa, qb) if Fraction(y.c, y.n) < Fraction(x.c, x.n))
    flips = [Flip(x.benchmark, x.id, x.text, (x.c, x.n), (y.c, y.n)) for x, y in zip(qa, qb) if (x.c > 0) != (y.c > 0)]
    return PairedResult(
        name=name, shared=len(qa), only_a=only_a, only_b=only_b, k_pass=k,
        avg_a=float(ra.mean()), avg_b=float(rb.mean()),
        avg_ci=bootstrap_mean_ci([rb - ra], n_boot, _seed("avg", seed)),
        pass_a=float(pa.mean()), pass_b=float(pb.mean()),
        pass_ci=bootstrap_mean_ci([pb - pa], n_boot, _seed("pass", seed)),
        b_better=b_better, a_better=a_better, ties=len(qa) - b_better - a_better,
        sign_p=sign_test_p(b_better, a_better), flips=flips,
    )


@dataclass
class Comparison:
    a: Run
    b: Run
    benchmarks: list[PairedResult]
    pooled: PairedResult
    notes: list[str]
    n_boot: int
    seed: int


def compare_runs(a: Run, b: Run, n_boot: int = 2000, seed: int = 0) -> Comparison:
    """Paired comparison of run B against run A on their shared questions (see the module docstring)."""
    qa, qb = questions(a.records), questions(b.records)
    shared = [k for k in qa if k in qb]
    if not shared:
        raise UserError(f"{a.name} and {b.name} share no questions (same benchmark and task id)")
    order = {bn: i for i, bn in enumerate(_suite_order(a.suite) or a.benchmarks)}
    benches = sorted({k[0] for k in shared}, key=lambda bn: (order.get(bn, 99), bn))
    results = []
    for bn in benches:
        keys = [k for k in shared if k[0] == bn]
        only_a = sum(1 for k in qa if k[0] == bn and k not in qb)
        only_b = sum(1 for k in qb if k[0] == bn and k not in qa)
        results.append(_paired(bn, [qa[k] for k in keys], [qb[k] for k in keys], only_a, only_b, n_boot, seed))
    pooled = _paired(MICRO, [qa[k] for k in shared], [qb[k] for k in shared],
                     sum(1 for k in qa if k not in qb), sum(1 for k in qb if k not in qa), n_boot, seed)
    notes = []
    if a.n != b.n:
        notes.append(f"n differs (A {a.n}, B {b.n}): avg@n compares success rates; pass uses k = min n "
                     "(unbiased estimator)")
    if a.sampling_signature != b.sampling_signature:
        notes.append(f"sampling differs: A {a.sampling_label}; B {b.sampling_label}")
    if a.suite != b.suite:
        notes.append(f"suites differ (A {a.suite}, B {b.suite})")
    for r in results:
        if r.only_a or r.only_b:
            notes.append(f"{r.name}: {r.only_a} questions only in A, {r.only_b} only in B (left out)")
    only_a_b = [bn for bn in {k[0] for k in qa} ^ {k[0] for k in qb} if bn not in benches]
    if only_a_b:
        notes.append(f"benchmarks in one run only (left out): {', '.join(sorted(only_a_b))}")
    return Comparison(a, b, results, pooled, notes, n_boot, seed)


def _pts(x: float) -> str:
    return f"{100 * x:+.1f}"


def _p(p: float) -> str:
    return f"{p:.3g}" if p >= 1e-4 else f"{p:.1e}"


def compare_markdown(cmp: Comparison, max_flips: int = 50) -> str:
    """The comparison as Markdown: a table per benchmark + pooled, then the flipped questions."""
    from tabulate import tabulate

    a, b = cmp.a, cmp.b
    head = ["benchmark", "shared questions", "A avg@n", "B avg@n", "Δ avg (pts) [95% CI]", "A pass@k", "B pass@k",
            "Δ pass (pts) [95% CI]", "k", "B better / A better / tied", "sign test p", "flips (B only / A only)"]
    body = []
    for r in cmp.benchmarks + [cmp.pooled]:
        fb = sum(1 for f in r.flips if f.direction == "B only")
        body.append([r.name, r.shared, _pct(r.avg_a), _pct(r.avg_b),
                     f"{_pts(r.avg_diff)} [{_pts(r.avg_ci[0])}, {_pts(r.avg_ci[1])}]",
                     _pct(r.pass_a), _pct(r.pass_b), f"{_pts(r.pass_diff)} [{_pts(r.pass_ci[0])}, {_pts(r.pass_ci[1])}]",
                     r.k_pass, f"{r.b_better} / {r.a_better} / {r.ties}", _p(r.sign_p), f"{fb} / {len(r.flips) - fb}"])
    lines = [
        "# Paired comparison: B vs A", "",
        f"- A: `{a.name}` ({a.model_label}; {a.team_label}; n={a.n}; {a.sampling_label}; seed {a.seed})",
        f"- B: `{b.name}` ({b.model_label}; {b.team_label}; n={b.n}; {b.sampling_label}; seed {b.seed})", "",
        "Differences are B - A in percentage points over the questions both runs answered (same benchmark "
        f"and task id). CIs: paired bootstrap over questions, {cmp.n_boot} resamples, seed {cmp.seed}. Sign test: "
        "exact two-sided binomial over questions whose per-question success rate differs. pass@k uses the "
        "unbiased estimator at k = the smaller n. A flip is a question solved at least once in one run and "
        "never in the other.", "",
        tabulate(body, head, tablefmt="github", disable_numparse=True), "",
    ]
    if cmp.notes:
        lines += [*[f"- {n}" for n in cmp.notes], ""]
    flips = [f for r in cmp.benchmarks for f in r.flips]
    lines += [f"## Flipped questions ({len(flips)})", ""]
    if flips:
        fl = [[f.benchmark, f.id, f.direction, f"{f.a[0]}/{f.a[1]}", f"{f.b[0]}/{f.b[1]}", _clip(f.question, 70)]
              for f in flips[:max_flips]]
        lines.append(tabulate(fl, ["benchmark", "task id", "solved by", "A correct/n", "B correct/n", "question"],
                              tablefmt="github", disable_numparse=True))
        if len(flips) > max_flips:
            lines.append(f"\n... and {len(flips) - max_flips} more (raise --max-flips to list them)")
    else:
        lines.append("none")
    return "\n".join(lines) + "\n"


def _clip(s: str, width: int) -> str:
    s = " ".join(str(s).split()).replace("|", "\\|")
    return s if len(s) <= width else s[: width - 1] + "…"


# ============================================================================== cost studies


@dataclass
class AgentCost:
    """One agent's calls in a run: tokens (exact ints) and dollars (an exact sum of per-call floats)."""

    agent: str
    price_keys: list[str]
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    usd: Fraction = Fraction(0)
    latency_s: float = 0.0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class TeamCost:
    """Accuracy, latency, tokens and dollars of one run ("per question" = per trajectory: one answer)."""

    label: str
    run: Run
    questions: int
    trajectories: int
    avg: float  # micro avg@n
    pass_n: float  # micro pass@n (any success among each question's samples, metrics.pass_at_n)
    latency_p50: float  # of trajectory wall_s
    latency_p95: float
    call_latency_mean: float  # mean over trajectories of the summed per-call latency_s
    agents: dict[str, AgentCost]
    prompt_tokens: int
    completion_tokens: int
    usd: Fraction  # every call's cost, summed exactly

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def usd_per_1k(self) -> float:
        """Dollars per 1,000 questions answered (one trajectory each)."""
        return float(self.usd * 1000 / self.trajectories)

    def agent_usd_per_1k(self, agent: str) -> float:
        return float(self.agents[agent].usd * 1000 / self.trajectories)


def turn_cost(run: Run, turn: dict[str, Any], prices: Any) -> float:
    """One call's dollars: the price sheet entry of the turn's worker group's model, on the recorded
    prompt/completion tokens and (for GPU-hour prices) its latency."""
    c = turn.get("completion") or {}
    return prices.cost(run.price_key(str(turn.get("wg", ""))), int(c.get("prompt_tokens", 0)),
                       int(c.get("completion_tokens", 0)), float(c.get("latency_s", 0.0)))


def team_cost(run: Run, prices: Any, label: str | None = None) -> TeamCost:
    """The cost-study numbers of one run, recomputed from its recorded turns with `prices`."""
    qs = questions(run.records)
    agents: dict[str, AgentCost] = {a: AgentCost(a, []) for a in run.agents}
    total = Fraction(0)
    prompt = completion = 0
    call_lat = []
    for r in run.records:
        lat = 0.0
        for t in r.get("turns", []):
            name = str(t.get("agent", "?"))
            ac = agents.setdefault(name, AgentCost(name, []))
            key = run.price_key(str(t.get("wg", "")))
            if key not in ac.price_keys:
                ac.price_keys.append(key)
            c = t.get("completion") or {}
            usd = Fraction(turn_cost(run, t, prices))
            ac.calls += 1
            ac.prompt_tokens += int(c.get("prompt_tokens", 0))
            ac.completion_tokens += int(c.get("completion_tokens", 0))
            ac.usd += usd
            ac.latency_s += float(c.get("latency_s", 0.0))
            prompt += int(c.get("prompt_tokens", 0))
            completion += int(c.get("completion_tokens", 0))
            total += usd
            lat += float(c.get("latency_s", 0.0))
        call_lat.append(lat)
    for a, ac in agents.items():  # an agent that never acted still names its model
        if not ac.price_keys and (wg := run.agent_wg(a)):
            ac.price_keys.append(run.price_key(wg))
    walls = np.array([float(r.get("wall_s", 0.0)) for r in run.records])
    return TeamCost(
        label=label or run.name, run=run, questions=len(qs), trajectories=len(run.records),
        avg=float(np.mean([q.c / q.n for q in qs.values()])),
        pass_n=float(np.mean([pass_at_n(q.n, q.c) for q in qs.values()])),
        latency_p50=float(np.percentile(walls, 50)), latency_p95=float(np.percentile(walls, 95)),
        call_latency_mean=float(np.mean(call_lat)), agents=agents,
        prompt_tokens=prompt, completion_tokens=completion, usd=total,
    )


def cost_study(runs: Sequence[Run], prices: Any, labels: Sequence[str] | None = None) -> list[TeamCost]:
    """`team_cost` for each run (labels default to the run names)."""
    labels = list(labels) if labels else [r.name for r in runs]
    if len(labels) != len(runs):
        raise UserError(f"--labels: {len(labels)} labels for {len(runs)} runs")
    return [team_cost(r, prices, lab) for r, lab in zip(runs, labels)]


def _rel(x: float, base: float) -> str:
    if base == 0:
        return "–" if x == 0 else "n/a (base 0)"
    return f"{100 * (x - base) / base:+.1f}%"


def _usd(x: float) -> str:
    if x == 0:
        return "0"
    return f"{x:.4f}" if abs(x) >= 0.01 else f"{x:.3g}"


def cost_notes(costs: Sequence[TeamCost]) -> list[str]:
    """Flags on what makes the teams' numbers not directly comparable."""
    notes = []
    base = costs[0].run
    for c in costs[1:]:
        r = c.run
        if r.suite != base.suite or sorted(r.benchmarks) != sorted(base.benchmarks):
            notes.append(f"{c.label}: other benchmarks ({r.suite}: {', '.join(r.benchmarks)}) than {costs[0].label}")
        elif set(questions(r.records)) != set(questions(base.records)):
            notes.append(f"{c.label}: a different question set than {costs[0].label}")
        if r.n != base.n:
            notes.append(f"{c.label}: n={r.n} vs n={base.n}")
        if r.sampling_signature != base.sampling_signature:
            notes.append(f"{c.label}: sampling {r.sampling_label} vs {base.sampling_label}")
    return notes


def cost_markdown(costs: Sequence[TeamCost], prices_source: str = "the price sheet", unpriced: Iterable[str] = ()) -> str:
    """The study as Markdown: the team table (relative to the first team) and per-agent breakdowns."""
    from tabulate import tabulate

    base = costs[0]
    head = ["team", "model", "questions x n", "avg@n (%)", "Δ avg (pts)", "pass@n (%)", "latency p50 (s)",
            "latency p95 (s)", "Δ p50", "summed call latency (s)", "Δ call latency", "tokens / question",
            "$ / 1k questions", "Δ $"]
    body = []
    for c in costs:
        body.append([c.label, c.run.model_label, f"{c.questions} x {c.run.n}", _pct(c.avg),
                     "–" if c is base else _pts(c.avg - base.avg), _pct(c.pass_n),
                     f"{c.latency_p50:.2f}", f"{c.latency_p95:.2f}", "–" if c is base else _rel(c.latency_p50, base.latency_p50),
                     f"{c.call_latency_mean:.2f}", "–" if c is base else _rel(c.call_latency_mean, base.call_latency_mean),
                     f"{c.tokens / c.trajectories:.1f}", _usd(c.usd_per_1k),
                     "–" if c is base else _rel(c.usd_per_1k, base.usd_per_1k)])
    lines = [
        "# Cost study", "",
        f"Relative columns (Δ) compare with the first team, `{base.label}`. A question = one trajectory (one "
        "answered question); latency = the trajectory's wall time (p50/p95) and the mean of its calls' summed "
        f"latencies; dollars recomputed from every call's recorded tokens with {prices_source} and the model of "
        "the call's worker group.", "",
        tabulate(body, head, tablefmt="github", disable_numparse=True), "",
        "## Per-agent breakdown", "",
        "Tokens and dollars per agent over the whole run; each team's `total` line is the sum of its agents "
        "(dollars rounded for display only).", "",
    ]
    ag_head = ["team", "agent", "priced as", "calls", "prompt tokens", "completion tokens", "tokens / question",
               "$ (run)", "$ / 1k questions", "share of $"]
    rows = []
    for c in costs:
        for a, ac in c.agents.items():
            share = "–" if c.usd == 0 else f"{100 * float(ac.usd / c.usd):.1f}%"
            rows.append([c.label, a, ", ".join(ac.price_keys) or "–", ac.calls, ac.prompt_tokens, ac.completion_tokens,
                         f"{ac.tokens / c.trajectories:.1f}", _usd(float(ac.usd)), _usd(c.agent_usd_per_1k(a)), share])
        rows.append([c.label, "**total**", "", sum(x.calls for x in c.agents.values()), c.prompt_tokens,
                     c.completion_tokens, f"{c.tokens / c.trajectories:.1f}", _usd(float(c.usd)), _usd(c.usd_per_1k),
                     "100%" if c.usd else "–"])
    lines.append(tabulate(rows, ag_head, tablefmt="github", disable_numparse=True))
    notes = cost_notes(costs)
    unpriced = sorted(set(unpriced))
    if unpriced:
        notes.append(f"unpriced models (costed at $0 by the sheet's `default: zero`): {', '.join(unpriced)}")
    if notes:
        lines += ["", "Notes:", "", *[f"- {n}" for n in notes]]
    return "\n".join(lines) + "\n"


def cost_csv(costs: Sequence[TeamCost]) -> str:
    """One line per (team, agent) plus a `total` line per team; raw numbers."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["team", "run", "agent", "priced_as", "questions", "n", "trajectories", "avg_at_n", "pass_at_n",
                "latency_p50_s", "latency_p95_s", "call_latency_mean_s", "calls", "prompt_tokens",
                "completion_tokens", "usd", "usd_per_1k_questions"])
    for c in costs:
        common = [c.label, str(c.run.path)]
        for a, ac in c.agents.items():
            w.writerow(common + [a, "|".join(ac.price_keys), c.questions, c.run.n, c.trajectories, "", "", "", "", "",
                                 ac.calls, ac.prompt_tokens, ac.completion_tokens, repr(float(ac.usd)),
                                 repr(c.agent_usd_per_1k(a))])
        w.writerow(common + ["total", "", c.questions, c.run.n, c.trajectories, repr(c.avg), repr(c.pass_n),
                             repr(c.latency_p50), repr(c.latency_p95), repr(c.call_latency_mean),
                             sum(x.calls for x in c.agents.values()), c.prompt_tokens, c.completion_tokens,
                             repr(float(c.usd)), repr(c.usd_per_1k)])
    return buf.getvalue()


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points (cost, accuracy) that no other point dominates (cost <= and accuracy >=,
    one strictly), sorted by cost. Lower cost and higher accuracy are better."""
    front = []
    for i, (ci, ai) in enumerate(points):
        dominated = any((cj <= ci and aj >= ai) and (cj < ci or aj > ai) for j, (cj, aj) in enumerate(points) if j != i)
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: (points[i][0], -points[i][1]))


def plot_pareto(costs: Sequence[TeamCost], path: str | Path, title: str = "", prices_source: str = "price sheet") -> Path:
    """Accuracy vs $ per 1k questions and vs p50 latency, one marker per team, the Pareto front marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5 + 0.25 * len(costs)))
    markers = "osD^vP*Xh<>p"
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    panels = [
        ([c.usd_per_1k for c in costs], f"cost: $ per 1,000 questions (USD, {prices_source})"),
        ([c.latency_p50 for c in costs], "latency per question: p50 trajectory wall time (s)"),
    ]
    acc = [100 * c.avg for c in costs]
    for ax, (xs, xlabel) in zip(axes, panels):
        for i, c in enumerate(costs):
            ax.scatter(xs[i], acc[i], marker=markers[i % len(markers)], color=colors[i % len(colors)], s=90,
                       zorder=3, label=f"{i + 1}: {c.label}")
        spots: dict[tuple[float, float], list[int]] = {}
        for i in range(len(costs)):  # one label per spot: coinciding teams read "2,3"
            spots.setdefault((round(xs[i], 9), round(acc[i], 9)), []).append(i + 1)
        for (x, y), ids in spots.items():
            ax.annotate(",".join(map(str, ids)), (x, y), textcoords="offset points", xytext=(7, 7), fontsize=10,
                        fontweight="bold")
        front = pareto_front(list(zip(xs, acc)))
        fx, fy = [xs[i] for i in front], [acc[i] for i in front]
        ax.step(fx, fy, where="post", color="black", linestyle="--", linewidth=1.2, zorder=2,
                label="Pareto front (cheaper/faster and more accurate)")
        ax.scatter(fx, fy, s=260, facecolors="none", edgecolors="black", linewidths=1.3, zorder=4)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("accuracy: avg@n over all questions (%)")
        ax.grid(True, alpha=0.3)
        ax.margins(x=0.15, y=0.15)
        lo, hi = min(acc), max(acc)
        if hi - lo < 1:
            ax.set_ylim(lo - 5, hi + 5)
        y0, y1 = ax.get_ylim()
        ax.set_ylim(max(y0, -3.0), min(y1, 103.0))  # accuracy lives in [0, 100]
        if max(xs) == min(xs):
            ax.set_xlim(min(xs) - 1, max(xs) + 1)
    handles, labels = axes[0].get_legend_handles_labels()
    ncol = 1 if max(len(x) for x in labels) > 45 else 2
    rows = math.ceil(len(labels) / ncol)
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=9, frameon=True)
    fig.suptitle(title or "Cost study: accuracy vs cost and latency (up and left is better)")
    fig.tight_layout(rect=(0, min(0.45, 0.04 + 0.04 * rows), 1, 0.95))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ================================================================== heterogeneous assignments


def enumerate_assignments(agents: Sequence[str], models: Sequence[str]) -> list[dict[str, str]]:
    """Every assignment of `models` to `agents` (len(models) ** len(agents) of them), as dicts
    agent -> model in the agents' order; the first gives every agent models[0]."""
    agents, models = list(agents), list(models)
    if not agents or not models:
        raise UserError("enumerate_assignments needs at least one agent and one model")
    for what, xs in (("agent", agents), ("model", models)):
        dup = [x for x, k in Counter(xs).items() if k > 1]
        if dup:
            raise UserError(f"{what} named twice: {', '.join(dup)}")
    return [dict(zip(agents, combo)) for combo in itertools.product(models, repeat=len(agents))]


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", _short(s)).strip("-") or "model"


def assignment_team(assignment: dict[str, str], workflow: str | None = None, engine: str = "hf",
                    base_url: str | None = None) -> dict[str, Any]:
    """A team mapping (the `--team` file format) for one assignment: one worker group per distinct
    model, agents on the same model share it."""
    groups: dict[str, dict[str, Any]] = {}
    names: dict[str, str] = {}
    for model in dict.fromkeys(assignment.values()):
        name = _slug(model)
        while name in groups:
            name += "_"
        g: dict[str, Any] = {"model": model, "engine": engine}
        if base_url:
            g["base_url"] = base_url
        groups[name] = g
        names[model] = name
    team: dict[str, Any] = {}
    if workflow:
        team["workflow"] = workflow
    team["worker_groups"] = groups
    team["agents"] = {a: names[m] for a, m in assignment.items()}
    return team


def assignment_name(assignment: dict[str, str]) -> str:
    """A file-name-safe label, e.g. `verifier=qwen2.5-7b_searcher=llama-3.2-3b`."""
    return "_".join(f"{a}={_slug(m)}" for a, m in assignment.items())


def workflow_for_agents(agents: Sequence[str]) -> str | None:
    """The registered workflow whose agents are exactly `agents` (any order), or None."""
    from drmas_bench.workflows import WORKFLOWS

    for name, spec in WORKFLOWS.items():
        if set(spec.agents) == set(agents):
            return name
    return None


def write_assignment_teams(agents: Sequence[str], models: Sequence[str], out_dir: str | Path,
                           workflow: str | None = None, engine: str = "hf", base_url: str | None = None) -> list[Path]:
    """Write one team YAML per assignment into `out_dir`; returns the files in enumeration order."""
    from drmas_bench.workflows import WORKFLOWS

    if workflow is not None:
        if workflow not in WORKFLOWS:
            raise UserError(f"unknown workflow {workflow!r}; known: {', '.join(sorted(WORKFLOWS))}")
        want = set(WORKFLOWS[workflow].agents)
        if set(agents) != want:
            raise UserError(f"--assign names {', '.join(agents)} but workflow {workflow} has agents "
                            f"{', '.join(WORKFLOWS[workflow].agents)}")
    else:
        workflow = workflow_for_agents(agents)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for asg in enumerate_assignments(agents, models):
        team = assignment_team(asg, workflow, engine, base_url)
        f = out / f"{assignment_name(asg)}.yaml"
        header = "# written by `drmas-bench cost --assign`: " + ", ".join(f"{a} -> {m}" for a, m in asg.items()) + "\n"
        f.write_text(header + yaml.safe_dump(team, sort_keys=False), encoding="utf-8")
        files.append(f)
    return files
