"""A finished run as what the Hugging Face Hub reads: a folder with a model card (README.md whose
YAML front matter holds the ``model-index`` eval results, built with huggingface_hub's own
``ModelCardData`` / ``EvalResult``) and the per-trajectory details as ``samples.parquet``.

model-index: one result per benchmark and figure. task = text-generation named
``<suite> (<workflow>)``; dataset = the benchmark's hub dataset id (``drmas-bench/<name>`` for the
built-in toy suite), its config and split; metric = ``avg@16``, ``pass@1`` ... ``pass^k`` where the
summary has it (``@n`` written with the run's n), the value in percent as the summary has it.
samples.parquet: one row per trajectory (:data:`COLUMNS`), each agent's turns in a list column.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from huggingface_hub import EvalResult, ModelCard, ModelCardData

from drmas_bench.agents.assign import short_model_name
from drmas_bench.export.source import FinishedRun, benchmark_source, named_figures

CARD = "README.md"
DETAILS = "samples.parquet"
TASK_TYPE = "text-generation"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def figures(run: FinishedRun, block: dict[str, Any]) -> dict[str, float]:
    """A summary block's figures as the card shows them (``source.named_figures``), in percent."""
    return {shown: v * 100 for shown, (_, v) in named_figures(block, run.n).items()}


def eval_results(run: FinishedRun) -> list[Any]:
    """One huggingface_hub ``EvalResult`` per benchmark and figure of the run's summary."""
    out = []
    for bench, block in (run.summary.get("benchmarks") or {}).items():
        src = benchmark_source(bench)
        for metric, value in figures(run, block).items():
            out.append(EvalResult(
                task_type=TASK_TYPE, task_name=f"{run.suite} ({run.workflow})", dataset_type=str(src["type"]),
                dataset_name=bench, dataset_config=src["config"], dataset_split=src["split"],
                metric_type=metric, metric_value=round(value, 4), metric_name=metric,
                verified=False))
    return out


def model_name(run: FinishedRun) -> str:
    """The model-index name: the team's one model, or its models joined by ``+``."""
    return "+".join(short_model_name(m) for m in run.models)


def card_text(run: FinishedRun) -> str:
    """README.md: the YAML front matter the Hub reads, then a short human description."""
    hub_models = [m for m in run.models if _HUB_ID.match(m) and not Path(m).exists()]
    data = ModelCardData(
        model_name=model_name(run), eval_results=eval_results(run), base_model=hub_models or None,
        tags=["drmas-bench", "multi-agent", f"suite:{run.suite}", f"workflow:{run.workflow}"]
        + (["partial-run"] if run.stopped or run.unreadable_lines else []),
    )
    team = run.team.get("agents") or {}
    lines = [f"# {model_name(run)} on the {run.suite} suite ({run.workflow} workflow)", "",
             f"Evaluated with drmas-bench: {len(run.records)} trajectories, n = {run.n} samples per question. "
             f"The figures are the run's summary.json (`avg@{run.n}` is the mean score over all samples, `pass@k` "
             "the unbiased chance that at least one of k samples is right, `pass^k`, where shown, that all k are); the "
             f"per-trajectory details are in `{DETAILS}`.", ""]
    if run.stopped:
        lines += [f"**Partial run:** stopped before its selection was done ({run.stopped}).", ""]
    if run.unreadable_lines:
        lines += [f"**Incomplete details:** {len(run.unreadable_lines)} unreadable line(s) of samples.jsonl were "
                  f"left out (lines {', '.join(map(str, run.unreadable_lines))}).", ""]
    lines += ["| agent | model |", "|---|---|"]
    lines += [f"| {a} | {short_model_name(run.agent_model(a))} |" for a in team]
    benches = run.summary.get("benchmarks") or {}
    cols = list(dict.fromkeys(k for block in benches.values() for k in figures(run, block)))
    lines += ["", "| benchmark (%) | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for bench, block in benches.items():
        fig = figures(run, block)
        lines.append(f"| {bench} | " + " | ".join(f"{fig[c]:.2f}" if c in fig else "–" for c in cols) + " |")
    if len(benches) > 1:
        fig = figures(run, run.summary.get("micro") or {})
        lines.append("| all (micro) | " + " | ".join(f"{fig[c]:.2f}" if c in fig else "–" for c in cols) + " |")
    return f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines) + "\n"


TURN = {"agent": "string", "worker_group": "string", "model": "string", "reply": "string", "valid": "bool",
        "finish": "string", "prompt_tokens": "int64", "completion_tokens": "int64", "latency_s": "float64"}

#: samples.parquet's columns and their Arrow types ("turns" is a list of TURN structs)
COLUMNS = {"benchmark": "string", "task_id": "string", "sample_idx": "int64", "question": "string",
           "answers": "list<string>", "final_answer": "string", "correct": "bool", "reward": "float64",
           "agents": "list<string>", "calls": "int64", "prompt_tokens": "int64", "completion_tokens": "int64",
           "cost_usd": "float64", "wall_s": "float64", "turns": "list<turn>", "extra": "string"}


def _arrow_type(name: str) -> Any:
    scalar = {"string": pa.string(), "bool": pa.bool_(), "int64": pa.int64(), "float64": pa.float64()}
    if name == "list<string>":
        return pa.list_(pa.string())
    if name == "list<turn>":
        return pa.list_(pa.struct([(k, scalar[v]) for k, v in TURN.items()]))
    return scalar[name]


def detail_rows(run: FinishedRun) -> list[dict[str, Any]]:
    """One row per trajectory, sorted by benchmark, task id and sample index."""
    rows = []
    for r in sorted(run.views, key=lambda r: (r.benchmark, r.task_id, r.sample_idx or 0)):
        turns = []
        for t in r.turns:
            c = t.call
            turns.append({"agent": t.agent, "worker_group": t.wg,
                          "model": short_model_name(run.agent_model(t.agent, t.wg)),
                          "reply": c.text, "valid": t.valid, "finish": c.finish,
                          "prompt_tokens": c.prompt_tokens if c.tokens_recorded else None,
                          "completion_tokens": c.completion_tokens if c.tokens_recorded else None,
                          "latency_s": c.latency_s})
        ans = r.final_answer
        rows.append({
            "benchmark": r.benchmark, "task_id": r.task_id, "sample_idx": r.sample_idx,
            "question": r.question, "answers": [str(a) for a in r.answers],
            "final_answer": None if ans is None else str(ans), "correct": r.correct,
            "reward": r.reward, "agents": [t["agent"] for t in turns], "calls": len(turns),
            "prompt_tokens": sum(t.call.prompt_tokens for t in r.turns),
            "completion_tokens": sum(t.call.completion_tokens for t in r.turns),
            "cost_usd": r.cost_usd, "wall_s": r.wall_s, "turns": turns,
            "extra": json.dumps(dict(r.extra), sort_keys=True, default=str)})
    return rows


def write_hub(run: FinishedRun, out: Path) -> list[Path]:
    """Write the folder ``out`` (README.md + samples.parquet); returns the files written."""
    text = card_text(run)
    ModelCard(text)  # the Hub's own parser accepts it (raises on a malformed front matter)
    schema = pa.schema([(k, _arrow_type(v)) for k, v in COLUMNS.items()],
                       metadata={b"drmas": json.dumps({"run": run.name, "suite": run.suite, "n": run.n,
                                                       "stopped": run.stopped,
                                                       "unreadable_lines": run.unreadable_lines}).encode()})
    table = pa.Table.from_pylist(detail_rows(run), schema=schema)
    out.mkdir(parents=True, exist_ok=True)
    (out / CARD).write_text(text, encoding="utf-8")
    pq.write_table(table, out / DETAILS)
    return [out / CARD, out / DETAILS]
