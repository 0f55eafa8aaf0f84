"""Run directories read back: `Run` (config, records, labels), `load_run`, `load_runs`,
`expand_run_dirs`. Records come from `drmas_bench.run_samples.read_samples` (the one samples.jsonl
reader) through `drmas_bench.run_samples.select_records` (the one selection: the configured benchmarks,
the questions a --limit chose, sample indices below the configured n), the same records the
run's own summary.json counts.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml

from drmas_bench.agents.assign import short_model_name
from drmas_bench.compact import current_records
from drmas_bench.records import RecordView, views
from drmas_bench.run_samples import SAMPLES, read_samples, sample_key, select_records
from drmas_bench.types import UserError

logger = logging.getLogger(__name__)


class NoSamples(UserError):
    """A run directory that was started but holds no finished sample of its selection yet."""

SAMPLING_KEYS = ("temperature", "top_p", "max_new_tokens")


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
    base_models: dict[str, str] | None = None  # a trained team's worker group -> the model it was trained from
    model_names: dict[str, str] | None = None  # a validation's worker group -> `model@step_N` (identity.models)
    training_run: str | None = None  # a validation's training run folder
    views: list[RecordView] = field(default_factory=list, repr=False)  # the records as typed views, built once

    def __post_init__(self) -> None:
        if not self.views and self.records:
            self.views = views(self.records)

    @property
    def agents(self) -> list[str]:
        return list((self.team.get("agents") or {}).keys())

    def wg_model(self, wg: str) -> str:
        named = (self.model_names or {}).get(wg)  # a validation's: `tiny-random@step_2`
        if named:
            return named
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
        base = (self.base_models or {}).get(wg)  # a checkpoint's group: its base model, not its folder name
        return Path(str(base or self.wg_model(wg)).rstrip("/")).name

    def agent_wg(self, agent: str) -> str | None:
        v = (self.team.get("agents") or {}).get(agent)
        return v.get("wg") if isinstance(v, dict) else v

    @property
    def model_label(self) -> str:
        """One model name, or `agent:model` groups when the agents' models differ."""
        by_model: dict[str, list[str]] = {}
        for a in self.agents:
            wg = self.agent_wg(a)
            by_model.setdefault(short_model_name(self.wg_model(wg)) if wg else "?", []).append(a)
        if len(by_model) == 1:
            return next(iter(by_model))
        return "; ".join(f"{'/'.join(ags)}: {m}" for m, ags in by_model.items())

    def base_model(self, wg: str) -> str:
        """The model a worker group started from: a trained team's base model, else its own."""
        base = (self.base_models or {}).get(wg)
        return str(base) if base else self.wg_model(wg)

    @property
    def team_label(self) -> str:
        """shared (one worker group), non-shared (one per agent) or `K groups`; + heterogeneous when
        the groups start from different BASE models (two copies of one model trained apart are not)."""
        wgs = {self.agent_wg(a) for a in self.agents}
        models = {self.base_model(w) for w in wgs if w}
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
            parts.append(f"T={fmt_num(t)} top_p={fmt_num(p)} max={m}")
        return " | ".join(parts) if parts else "–"


def fmt_num(x: Any) -> str:
    return f"{x:g}" if isinstance(x, (int, float)) and not isinstance(x, bool) else str(x)


def _trained_info(config: dict[str, Any], run_path: Path) -> tuple[str | None, Any, dict[str, str] | None]:
    """(estimator, step, base models by worker group) from a trained team's `trained:` block, when the
    run names one.

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
        if est is not None and isinstance(t.get("group_by_agent"), bool):  # a reference name: its index is part of it
            est = f"{est}[{'by_agent' if t['group_by_agent'] else 'by_uid'}]"
        step = t.get("step", t.get("global_step"))
        bases = t.get("base_models") if isinstance(t.get("base_models"), dict) else None
        if est is not None or step is not None:
            return (str(est) if est is not None else None), step, bases
    return None, None, None


def _validation_info(config: dict[str, Any]) -> tuple[dict[str, str], dict[str, str], Any, str | None, str | None]:
    """A trainer's validation (identity.models naming ``model@step_N``, its ``step`` and training
    ``run``): (model names, base models by worker group, step, estimator from the training run's
    config.yaml ``algo.estimator``, the training run); empty for any other run."""
    models = (config.get("identity") or {}).get("models") or {}
    val = {wg: m for wg, m in models.items() if isinstance(m, dict) and m.get("run") and m.get("step") is not None}
    if not val:
        return {}, {}, None, None, None
    names = {wg: str(m.get("name") or "") for wg, m in val.items() if m.get("name")}
    bases = {wg: n.rsplit("@", 1)[0] for wg, n in names.items() if "@" in n}
    first = next(iter(val.values()))
    estimator = None
    try:
        train = yaml.safe_load((Path(str(first["run"])) / "config.yaml").read_text(encoding="utf-8")) or {}
        est = (train.get("algo") or {}).get("estimator") if isinstance(train, dict) else None
        estimator = str(est) if est is not None else None
    except (OSError, yaml.YAMLError):
        pass
    return names, bases, first["step"], estimator, str(first["run"])


def _read_config(p: Path) -> dict[str, Any]:
    """RUN/config.yaml, checked to be a run's configuration (a UserError saying what is wrong otherwise)."""
    cfg_path = p / "config.yaml"
    if not cfg_path.is_file():
        raise UserError(f"{p}: not a run directory (no config.yaml); make one with `drmas-bench eval --out {p}`")
    try:
        config = yaml.safe_load(cfg_path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise UserError(f"{cfg_path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(config, dict) or "identity" not in config:
        if (p / "metrics.jsonl").is_file() or (p / "ckpt").is_dir():  # the trainer's files: a training run
            raise UserError(f"{p} is a training run, not an eval run: see it with `drmas-bench train-report {p}` "
                            f"(its validations are eval runs: {p / 'val'})")
        raise UserError(f"{cfg_path}: not a run config (no `identity`)")
    return config


def _run_of(p: Path, config: dict[str, Any], records: list[dict[str, Any]], recs: list[RecordView]) -> Run:
    n = int(config.get("n") or 0)
    benches = [str(b) for b in config.get("benchmarks") or []]
    ident = config["identity"]
    sampling = {a: {k: s.get(k) for k in SAMPLING_KEYS} for a, s in (ident.get("sampling") or {}).items()}
    estimator, step, base_models = _trained_info(config, p)
    names, bases, val_step, val_estimator, training_run = _validation_info(config)
    if names:  # a trainer's validation: its models, step, estimator and training run (the folder's name beside it)
        step, estimator = val_step, val_estimator or estimator
        base_models = {**bases, **(base_models or {})}
    elif base_models and step is not None:  # an eval of a saved checkpoint: its base model at its step
        names = {wg: f"{b}@step_{step}" for wg, b in base_models.items()}
    name = f"{Path(training_run).name}/{p.name}" if training_run else (p.name or str(p))
    return Run(path=p, name=name, config=config, records=records, suite=str(config.get("suite", "?")),
               workflow=str(config.get("workflow", "?")),
               n=n or (max(r.sample_idx or 0 for r in recs) + 1 if recs else 0),
               benchmarks=benches or sorted({r.benchmark for r in recs}),
               team=ident.get("team") or {}, sampling=sampling, seed=ident.get("seed"),
               estimator=estimator, step=step, base_models=base_models or None, model_names=names or None,
               training_run=training_run, views=recs)


def load_run(path: str | Path, compact: bool = False) -> Run:
    """Read a run directory written by `drmas-bench eval`.

    Only the records of the configuration's selection count (`store.select_records`: a run dir
    re-run with a smaller --limit / --n keeps the other samples on disk, uncounted). A run dir
    without finished samples raises `NoSamples`. ``compact``: the records may come in compact form
    (no prompts, no passages: `drmas_bench.compact`), read from RUN/records.compact.jsonl when it is
    in step with samples.jsonl; for readers of figures (leaderboards), not of texts (the viewer)."""
    p = Path(path)
    config = _read_config(p)
    kept = current_records(p, sample_key) if compact else None
    records = select_records(kept if kept is not None else read_samples(p / SAMPLES, missing_ok=True), config)
    if not records:
        raise NoSamples(f"{p}: the run has no finished samples yet")
    return _run_of(p, config, records, views(records))


def open_run(path: str | Path) -> Run:
    """A run directory's configuration and labels as a `Run` holding no record (``records`` empty;
    ``n`` 0 and ``benchmarks`` empty where the configuration names none): for readers that stream
    the records themselves (the viewer: `report.view_scan`)."""
    p = Path(path)
    return _run_of(p, _read_config(p), [], [])


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


def load_runs(paths: Iterable[str | Path], compact: bool = False) -> list[Run]:
    """`load_run` over `expand_run_dirs`, giving runs with the same folder name distinct names. A run
    dir without finished samples (started, stopped before its first flush) is skipped with a
    warning; none left is a UserError."""
    runs = []
    dirs = expand_run_dirs(paths)
    for p in dirs:
        try:
            runs.append(load_run(p, compact=compact))
        except NoSamples as e:
            logger.warning(f"warning: skipping {p}: {str(e).split(': ', 1)[-1]}")
    return named_apart(runs, len(dirs))


def named_apart(runs: list[Run], n_dirs: int) -> list[Run]:
    """``runs`` (read from ``n_dirs`` run directories), those sharing a folder name renamed to their
    path; none at all is a UserError."""
    if not runs:
        raise UserError(f"none of the {n_dirs} run directories holds finished samples yet")
    counts = Counter(r.name for r in runs)
    for r in runs:
        if counts[r.name] > 1:
            r.name = str(r.path)
    return runs


# ------------------------------------------------------------------------------ comparability


def grader_label(run: Run) -> str:
    """What graded the run: ``name@version`` for math graders, the family otherwise ("?" unknown)."""
    g = (run.config.get("provenance") or {}).get("grader") or (run.config.get("identity") or {}).get("grader") or {}
    if not isinstance(g, dict) or not g:
        return "?"
    if g.get("name"):
        return f"{g['name']}@{g.get('version', '?')}"
    return str(g.get("family", "?"))


def prompts_label(run: Run) -> str:
    """The run's prompt templates (first 12 hex digits of their sha256), "packaged/none" when not recorded."""
    sha = ((run.config.get("identity") or {}).get("protocol") or {}).get("prompts_sha256")
    return str(sha)[:12] if sha else "none recorded"


def protocol_label(run: Run) -> str:
    """The run's protocol options: the prompt limit and its truncation side."""
    p = (run.config.get("identity") or {}).get("protocol") or {}
    if not p:
        return "none recorded"
    return f"max_prompt_tokens={p.get('max_prompt_tokens') or 'none'} truncate={p.get('truncate', '?')}"


def question_keys(run: Run) -> set[tuple[str, str]]:
    """(benchmark, task id) of every question the run answered."""
    return {(r.benchmark, r.task_id) for r in run.views}


#: what must match for two runs' numbers to be compared directly (name -> the run's value, as text)
COMPARED = {
    "grader": grader_label,
    "prompts": prompts_label,
    "protocol": protocol_label,
    "n": lambda r: str(r.n),
    "sampling": lambda r: r.sampling_label,
}


def differences(run: Run, base: Run, base_label: str | None = None) -> list[str]:
    """What makes ``run``'s numbers not directly comparable with ``base``'s, one phrase each (empty:
    comparable): other benchmarks or question ids, then each of :data:`COMPARED` that differs. The
    one home of this check: cost studies, comparisons and leaderboards all call it."""
    label = base_label or base.name
    out = []
    if run.suite != base.suite or sorted(run.benchmarks) != sorted(base.benchmarks):
        out.append(f"other benchmarks ({run.suite}: {', '.join(run.benchmarks)}) than {label}")
    else:
        mine, theirs = question_keys(run), question_keys(base)
        if mine != theirs:
            out.append(f"a different question set than {label} ({len(mine & theirs)} shared; {len(mine - theirs)} only "
                       f"here, {len(theirs - mine)} only in {label})")
    for name, (a, b) in differing(run, base).items():
        out.append(f"n={a} vs n={b}" if name == "n" else f"{name} {a} vs {b}")
    return out


def differing(run: Run, base: Run, names: Iterable[str] = tuple(COMPARED)) -> dict[str, tuple[str, str]]:
    """{name: (run's value, base's value)} for each of :data:`COMPARED` (or ``names``) that differs."""
    out = {}
    for name in names:
        a, b = COMPARED[name](run), COMPARED[name](base)
        if a != b:
            out[name] = (a, b)
    return out
