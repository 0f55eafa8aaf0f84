"""A finished run as an Inspect AI log (``.eval``), built with inspect_ai's own log types and written
by its own writer, so ``inspect view`` and ``inspect_ai.log.read_eval_log`` open it.

The mapping:
- the eval spec: task = ``drmas-bench/<suite>``, dataset = the run's benchmarks, model = the team's
  model (``drmas-bench/<a>+<b>`` when the agents' models differ), ``model_roles`` = each agent and its
  model with its sampling, epochs = the run's n, the package's git revision and versions;
- one sample per trajectory: id ``<benchmark>:<task id>``, epoch = sample index + 1; its messages are
  every agent's turns in order (the prompt messages the agent had not yet seen, then its reply), each
  message's metadata naming its ``agent``, ``turn`` and ``worker_group``; one model event per call
  (role = the agent) with the call's tokens and latency; scores ``correct`` (the project's grade,
  1/0, with the final answer) and ``reward``; usage by model and by role (agent);
- results: the summary's figures (avg@n, pass@k, pass^k where the summary has it) of the whole run
  and, grouped, of each benchmark; usage by model and by agent in the stats.
A run stopped by a limit is written with status ``cancelled`` and ``metadata.drmas.stopped``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inspect_ai.event import ModelEvent
from inspect_ai.log import (
    EvalConfig,
    EvalDataset,
    EvalLog,
    EvalMetric,
    EvalResults,
    EvalRevision,
    EvalSample,
    EvalScore,
    EvalSpec,
    EvalStats,
    write_eval_log,
)
from inspect_ai.model import (
    ChatMessageAssistant,
    ChatMessageSystem,
    ChatMessageUser,
    GenerateConfig,
    ModelConfig,
    ModelOutput,
    ModelUsage,
)
from inspect_ai.scorer import Score

from drmas_bench.agents.assign import short_model_name
from drmas_bench.export.source import FinishedRun, Usage, add_turn, benchmark_source, metric_ci, named_figures
from drmas_bench.records import view
from drmas_bench.types import UserError

SCORER = "correct"  # the sample score holding the project's grade; results' first metric (avg@n) is the headline


def _model_id(model: str) -> str:
    return f"drmas-bench/{short_model_name(model)}"


def _usage(u: Usage) -> Any:
    return ModelUsage(input_tokens=u.prompt_tokens, output_tokens=u.completion_tokens, total_tokens=u.total_tokens,
                      total_cost=u.usd if u.usd else None)


def _message(m: dict[str, Any], meta: dict[str, Any]) -> Any:
    cls = {"system": ChatMessageSystem, "assistant": ChatMessageAssistant}.get(str(m.get("role")), ChatMessageUser)
    return cls(content=str(m.get("content") or ""), source="input", metadata=meta)


def _model_event(t: Any, model: str, inputs: list[Any], usage: Any, meta: dict[str, Any], working: float) -> Any:
    """One recorded call (a `records.TurnView`) as an inspect_ai ``ModelEvent``: its prompt, reply,
    sampling, usage and time, starting ``working`` seconds into the sample."""
    c, sampling = t.call, t.sampling
    out = ModelOutput.from_content(model, c.text, stop_reason="max_tokens" if c.finish == "length" else "stop")
    out.usage = usage
    out.time = c.latency_s
    return ModelEvent(
        model=model, role=t.agent, input=inputs, tools=[], tool_choice="none", output=out,
        config=GenerateConfig(temperature=sampling.get("temperature"), top_p=sampling.get("top_p"),
                              max_tokens=sampling.get("max_new_tokens"), seed=sampling.get("seed")),
        cache="read" if c.cache_hit else None, working_start=working, working_time=c.latency_s, metadata=meta)


def sample_from_record(record: Any, run: FinishedRun) -> Any:
    """One trajectory record as an inspect_ai ``EvalSample``."""

    rec = view(record)
    messages: list[Any] = []
    events: list[Any] = []
    seen: dict[str, list[dict[str, Any]]] = {}  # agent -> its conversation shown so far (prompt + reply)
    by_model: dict[str, Usage] = {}
    by_agent: dict[str, Usage] = {}
    working = 0.0
    for i, t in enumerate(rec.turns):
        agent, wg = t.agent, t.wg
        model = _model_id(run.agent_model(agent, wg))
        c = t.call
        text = c.text
        meta = {"agent": agent, "turn": i, "step": t.turn, "worker_group": wg}
        prompt = list(t.messages)
        prev = seen.get(agent, [])
        new = prompt[len(prev):] if prompt[:len(prev)] == prev else prompt  # a growing conversation: only what is new
        inputs = [_message(m, {**meta, "part": "prompt"}) for m in prompt]
        messages += [_message(m, {**meta, "part": "prompt"}) for m in new]
        reply_meta = {**meta, "part": "reply", "valid": t.valid, "finish": c.finish,
                      "prompt_tokens": c.prompt_tokens if c.tokens_recorded else None,
                      "completion_tokens": c.completion_tokens if c.tokens_recorded else None,
                      "latency_s": c.latency_s}
        messages.append(ChatMessageAssistant(content=text, model=model, source="generate", metadata=reply_meta))
        seen[agent] = prompt + [{"role": "assistant", "content": text}]
        call = Usage()
        add_turn(call, t)
        for key, table in ((model, by_model), (agent, by_agent)):
            add_turn(table.setdefault(key, Usage()), t)
        events.append(_model_event(t, model, inputs, _usage(call), meta, working))
        working += c.latency_s
    answer = rec.final_answer
    extra = dict(rec.extra)
    scores = {
        SCORER: Score(value=1.0 if rec.correct else 0.0, answer=None if answer is None else str(answer),
                      metadata={"grade": extra} if extra else None),
        "reward": Score(value=rec.reward),
    }
    last = next((m for m in reversed(messages) if m.role == "assistant"), None)
    answers = [str(a) for a in rec.answers]
    return EvalSample(
        id=f"{rec.benchmark}:{rec.task_id}", epoch=(rec.sample_idx or 0) + 1, input=rec.question,
        target=answers if len(answers) != 1 else answers[0], messages=messages,
        output=ModelOutput.from_content(last.model or "", last.text) if last is not None else ModelOutput(),
        scores=scores, events=events,
        metadata={"benchmark": rec.benchmark, "task_id": rec.task_id, "sample_idx": rec.sample_idx,
                  "workflow": run.workflow, "cost_usd": rec.cost_usd, "task_meta": dict(rec.task_meta)},
        model_usage={k: _usage(u) for k, u in by_model.items()}, role_usage={k: _usage(u) for k, u in by_agent.items()},
        total_time=rec.wall_s, working_time=working,
    )


def _metrics(run: FinishedRun) -> dict[str, Any]:
    """The summary's figures (fractions, named as ``source.named_figures`` names them): the whole
    run's (micro) by name, then each benchmark's in its group, keyed ``<benchmark>/<figure>``."""
    blocks = [(None, run.summary.get("micro") or {})]
    benches = run.summary.get("benchmarks") or {}
    if len(benches) > 1:
        blocks += list(benches.items())
    out = {}
    for group, block in blocks:
        for shown, (name, v) in named_figures(block, run.n).items():
            ci = metric_ci(block, name)
            # a benchmark's figure carries the benchmark in its name too: Inspect's header shows names only
            out[shown if group is None else f"{group}/{shown}"] = EvalMetric(
                name=shown if group is None else f"{group} {shown}", group=group, value=v,
                metadata={"ci95": list(ci)} if ci else None)
    return out


def build_log(run: FinishedRun) -> Any:
    """The run as an inspect_ai ``EvalLog`` (module docstring)."""

    records = sorted(run.views, key=lambda r: (r.benchmark, r.task_id, r.sample_idx or 0))
    samples = [sample_from_record(r, run) for r in records]
    ident = run.config.get("identity") or {}
    sampling = ident.get("sampling") or {}
    prov = {**(run.config.get("provenance") or {}), **(run.summary.get("provenance") or {})}
    git = prov.get("git") or {}
    models = [_model_id(m) for m in dict.fromkeys(run.models)]
    model = models[0] if len(models) == 1 else "drmas-bench/" + "+".join(m.split("/", 1)[1] for m in models)
    roles: dict[str, ModelConfig | list[ModelConfig]] = {a: ModelConfig(model=_model_id(run.agent_model(a)),
                            config=GenerateConfig(temperature=(sampling.get(a) or {}).get("temperature"),
                                                  top_p=(sampling.get(a) or {}).get("top_p"),
                                                  max_tokens=(sampling.get(a) or {}).get("max_new_tokens")))
             for a in (run.team.get("agents") or {})}
    ids = list(dict.fromkeys(s.id for s in samples))
    pkg = prov.get("package") or {}
    # the run's own facts, in the spec's metadata and the log's (inspect_ai reads the log's back from the spec's)
    meta = {"run": run.name, "suite": run.suite, "workflow": run.workflow, "n": run.n, "team": run.team,
            "argv": prov.get("argv"), "grader": run.summary.get("grader"), "stopped": run.stopped,
            "partial": bool(run.stopped or run.unreadable_lines), "unreadable_lines": run.unreadable_lines}
    spec = EvalSpec(
        created=run.started_at or run.finished_at or "1970-01-01T00:00:00Z", task=f"drmas-bench/{run.suite}",
        task_id=str(run.views[0].run.get("identity") or run.name), run_id=run.name,
        task_display_name=f"{run.suite} ({run.workflow})",
        task_args={"suite": run.suite, "workflow": run.workflow, "benchmarks": run.benchmarks},
        solver=f"drmas-bench workflow {run.workflow}",
        dataset=EvalDataset(name=",".join(run.benchmarks), location=",".join(str(benchmark_source(b)["type"]) for b in run.benchmarks),
                            samples=len(ids), sample_ids=ids),
        model=model, model_roles=roles or None,
        config=EvalConfig(epochs=run.n, limit=run.config.get("limit")),
        revision=EvalRevision(type="git", origin="drmas-bench", commit=str(git["commit"]), dirty=git.get("dirty"))
        if git.get("commit") else None,
        packages={"drmas-bench": str(pkg.get("version"))} if pkg.get("version") else {},
        metadata={"drmas": meta},
    )
    micro = run.summary.get("micro") or {}
    results = EvalResults(
        total_samples=len(samples), completed_samples=len(samples),
        scores=[EvalScore(name=SCORER, scorer=SCORER, scored_samples=len(samples), unscored_samples=0,
                          metrics=_metrics(run),
                          metadata={"questions": micro.get("questions"), "n": micro.get("n"),
                                    "source": "the run's summary.json"})],
        metadata={"benchmarks": {b: {"questions": blk.get("questions"), "samples": blk.get("samples"),
                                     **{k: v for k, (_, v) in named_figures(blk, run.n).items()}}
                                 for b, blk in (run.summary.get("benchmarks") or {}).items()},
                  "macro": {k: v for k, (_, v) in named_figures(run.summary.get("macro") or {}, run.n).items()}},
    )
    stats = EvalStats(started_at=run.started_at or "", completed_at=run.finished_at or "",
                      model_usage={_model_id(k): _usage(u) for k, u in run.usage("model").items()},
                      role_usage={k: _usage(u) for k, u in run.usage("agent").items()})
    return EvalLog(status="cancelled" if run.stopped else "success", eval=spec, results=results, stats=stats,
                   samples=samples, metadata={"drmas": meta})


def write_inspect(run: FinishedRun, out: Path) -> list[Path]:
    """Write ``out`` (a ``.eval`` file) with inspect_ai's writer; returns the files written."""

    if out.suffix != ".eval":
        raise UserError(f"--out {out}: an Inspect log is a .eval file (name it {out.with_suffix('.eval').name})")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_eval_log(build_log(run), str(out), format="eval")
    return [out]
