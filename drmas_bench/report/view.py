"""`drmas-bench view RUN [RUN2]`: one self-contained HTML page that explains a run.

The page holds the run's report (`report.sections`: one table per question a reader asks, how
good, why, at what cost, where the time went, with human labels and inline SVG charts; for two runs
the questions fixed, broken and unchanged), a filterable list of the trajectories, and
each trajectory as its turns: the prompt, the response, the action the protocol makes of it, the
observation the env showed back, the verdict, the validity and the reward. With two runs the same
(benchmark, question, sample) pair sits side by side.

Why it is built the way it is: a 10,000-trajectory search run holds ~100 MB of prompts. The page
therefore embeds one small JSON index (one short row per trajectory, parsed at load, enough to
filter and list) and the turns as gzip-compressed JSON chunks of ``CHUNK`` trajectories, base64
text inside inert ``<script type="text/plain">`` elements, which the browser's own
``DecompressionStream`` opens only when a trajectory in that chunk is expanded. The list draws only
the rows in view. No server, no CDN, no framework: the page opens from disk. Above ``PACK_ROWS``
trajectories the rows (and the list's pairs) are gzip-packed in the index too, and the chunks are
written beside the page, in ``<page name>_files/chunk-R-C.js`` (a script that hands its chunk to the
page), which the page loads when a trajectory of that chunk is opened: a 100,000-trajectory page
stays under 5 MB and opens from disk without a server (keep the folder beside the page).

The run is read a record at a time (`report.view_scan`; `write_view` opens it with
`report.runs.open_run`, which reads the configuration only): the list's rows and the summary from
one read of the compact records (or samples.jsonl, read twice; `metrics.summarize`, over what the
store's selection keeps, the last copy of a repeated sample; so an old run dir shows today's
per-agent figures), then the turns, each full record read at its byte range of samples.jsonl, a
chunk at a time in the page's order; a chunk of a large page is written beside it as soon as it is
made. What stays in memory per trajectory is its list row and byte range (~0.5 KB) and what the
summary keeps per sample. `render` also takes runs loaded whole (`report.runs.load_run`) and gives
the same page. An unreadable line stops with the repair hint as every reader does. Parsing is
`workflows.protocol`'s and `metrics`'.
"""

from __future__ import annotations

import base64
import itertools
import json
import logging
import shutil
import zlib
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from drmas_bench import metrics
from drmas_bench.metrics import Question
from drmas_bench.records import RecordView, view, views
from drmas_bench.report import sections
from drmas_bench.report.charts import PALETTE
from drmas_bench.report.labels import all_labels, rule_words, stopped_text, workflow_name
from drmas_bench.report.runs import NoSamples, Run, open_run
from drmas_bench.report.sections import Change
from drmas_bench.report.view_scan import ROW_KEYS, Rows, details, natural, read, row_values, workflow_of
from drmas_bench.types import UserError
from drmas_bench.workflows import find_workflow
from drmas_bench.workflows.rules import FormatRule

logger = logging.getLogger(__name__)

CHUNK = 100  # trajectories per compressed chunk: one expand decompresses ~1 MB of text at most
PACK_ROWS = 2000  # above this many trajectories the list's rows are packed and the turns kept beside the page
TEMPLATE = "view.html.jinja"
def parsed(rule: FormatRule | None, text: str) -> tuple[str | None, str | None]:
    """(parsed action, verdict) of one response under its agent's format rule (the workflow's
    `WorkflowSpec.rules`): what the rule itself reads off the reply (`FormatRule.parse`); None where
    the rule reads none, or the agent has no rule."""
    return rule.parse(text) if rule is not None else (None, None)


def _env_step_agent(workflow: str | None) -> str | None:
    """The agent that opens each env step of ``workflow`` (`WorkflowSpec.env_step_agent`), None when
    it declares none or is unknown."""

    spec = find_workflow(workflow)
    return spec.env_step_agent if spec is not None else None


def turns_view(record: Any, workflow: str | None) -> list[dict[str, Any]]:
    """Each turn as the page shows it. In a workflow that declares an env step agent
    (`WorkflowSpec.env_step_agent`; search_route: the verifier) each env step opens with that agent's
    turn; the step's env record (action, query, observation, done, reward) goes on the step's last
    turn (the searcher's or answerer's, or the opener's when nobody acted)."""
    rec = view(record)
    rules = metrics.role_rules(workflow)
    opener = _env_step_agent(workflow)
    steps = rec.env_steps if opener else None
    out: list[dict[str, Any]] = []
    step_no = 0
    for t in rec.turns:
        agent, text, call = t.agent, t.text, t.call
        rule = rules.get(agent)
        action, verdict = parsed(rule, text)
        if opener and agent == opener:
            step_no += 1
        out.append({
            "agent": agent, "wg": t.wg, "step": t.turn, "env_step": step_no or None,
            "prompt": [{"role": str(m.get("role")), "content": str(m.get("content"))} for m in t.messages],
            "response": text, "action": action, "verdict": verdict, "valid": t.valid,
            "reasons": metrics.invalid_reasons(rule, text) if rule else [],
            "finish": call.finish, "prompt_tokens": call.prompt_tokens if call.tokens_recorded else None,
            "completion_tokens": call.completion_tokens if call.tokens_recorded else None,
            "latency_s": call.latency_s, "prompt_truncated": call.prompt_truncated,
        })
        if steps is not None and agent != opener and 0 < step_no <= len(steps):  # the step's actor
            out[-1]["env"] = steps[step_no - 1]
    if steps is not None:  # a step where nobody acted: its record goes on its verifier turn
        with_env = {o["env_step"] for o in out if "env" in o}
        for o in reversed(out):
            n = o["env_step"]
            if o["agent"] == opener and n not in with_env and n and n <= len(steps):
                o["env"] = steps[n - 1]
                with_env.add(n)
    return out


def trajectory_row(record: Any, workflow: str | None) -> dict[str, Any]:
    """One trajectory's list row: what the filters and the search box need, nothing more."""
    spec = find_workflow(workflow)  # the kind of each env step, as the workflow reads its records
    return dict(zip(ROW_KEYS, row_values(view(record), spec.env_step_kinds if spec is not None else None)))


def trajectory_detail(record: Any, workflow: str | None) -> dict[str, Any]:
    """One trajectory's expanded view: its turns and its outcome (env record kept on the turns)."""
    rec = view(record)
    extra = {k: v for k, v in rec.extra.items() if k != "env"}
    return {"question": rec.question, "answers": list(rec.answers),
            "final_answer": rec.final_answer, "reward": rec.reward, "correct": rec.correct,
            "extra": extra, "env_answer": rec.env.get("answer") if rec.env is not None else None,
            "wall_s": rec.wall_s, "cost_usd": rec.cost_usd, "turns": turns_view(rec, workflow)}


def _packed(obj: Any) -> str:
    """gzip + base64 of compact JSON: what the page's `DecompressionStream('gzip')` reads back."""
    return _packed_parts([json.dumps(obj, ensure_ascii=False, separators=(",", ":"))])


def _packed_parts(parts: Iterable[str]) -> str:
    """`_packed` of the JSON text given in parts (the same bytes as one `gzip.compress(.., 6, mtime=0)`)."""
    z = zlib.compressobj(6, zlib.DEFLATED, 31)
    out = [z.compress(p.encode("utf-8")) for p in parts]
    out.append(z.flush())
    return base64.b64encode(b"".join(out)).decode("ascii")


_natural = natural


def _order(records: list[Any]) -> list[RecordView]:
    """The page's order: benchmark, then question id (numbers in it compared as numbers), then sample."""
    return sorted(views(records), key=lambda r: (r.benchmark, _natural(r.task_id), r.sample_idx or 0))


def run_entry(run: Run, summary: dict[str, Any] | None = None) -> tuple[dict[str, Any], Callable[[], Iterator[str]], dict]:
    """(the index entry of one run, with its rows as `view_scan.Rows` and its summary; a function giving
    its compressed detail chunks one at a time; its questions, `metrics.questions`). A run opened
    with `runs.open_run` is read here a record at a time (`view_scan`), its ``n`` and ``benchmarks``
    filled in from the records where its configuration names none."""
    wf = workflow_of(run)
    rows = Rows()
    asked: dict[tuple[str, str], list] = {}  # the questions (`metrics.questions`), tallied as the summary reads
    feed = _tally_questions(read(run, wf, rows), asked)
    first = next(feed, None)
    if first is None:
        raise NoSamples(f"{run.path}: the run has no finished samples yet")
    logger.info(f"[view] {run.path}: the list and the summary, then the turns")
    feed = itertools.chain([first], feed)
    summ = summary if summary is not None else metrics.summarize(feed, workflow=wf)
    for _ in feed:  # the rows are complete (and in the page's order) once every record is read
        pass
    run.n = run.n or max(t[2] or 0 for t in rows.data) + 1
    run.benchmarks = run.benchmarks or sorted({t[0] for t in rows.data})
    qs = {k: Question(k[0], k[1], v[0], v[1], v[2], v[4]) for k, v in sorted(asked.items())}
    entry = {"name": run.name, "path": run.path.name, "workflow": wf, "suite": run.suite, "model": run.model_label,
             "team": run.team_label, "sampling": run.sampling_label, "n": run.n, "benchmarks": run.benchmarks,
             "agents": run.agents, "summary": summ, "rows": rows}

    def chunks() -> Iterator[str]:
        return (_packed(c) for c in details(run, rows, CHUNK, lambda r: trajectory_detail(r, wf)))

    return entry, chunks, qs


def _tally_questions(recs: Iterator[RecordView], acc: dict[tuple[str, str], list]) -> Iterator[RecordView]:
    """``recs`` passed on, each counted into ``acc`` as `metrics.questions` counts: (benchmark, id) ->
    [samples, correct, question text, sample indices, repeats]."""
    for r in recs:
        slot = acc.setdefault((r.benchmark, r.task_id), [0, 0, r.question, set(), 0])
        slot[0] += 1
        slot[1] += r.correct
        if r.sample_idx in slot[3]:
            slot[4] += 1
        slot[3].add(r.sample_idx)
        yield r


def run_data(run: Run, summary: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[str]]:
    """(the index entry of one run, its compressed detail chunks): `run_entry` with the chunks made."""
    entry, chunks, _ = run_entry(run, summary)
    return entry, list(chunks())


def pairs(rows_a: list[dict[str, Any]], rows_b: list[dict[str, Any]] | None) -> list[list[int]]:
    """The page's list: one entry per trajectory of run A, or with two runs one per (benchmark, id,
    sample) of either, as [index in A or -1, index in B or -1], A's order first."""
    if rows_b is None:
        return [[i] for i in range(len(rows_a))]
    key = lambda r: (r["b"], r["id"], r["s"])  # noqa: E731
    in_b = {key(r): j for j, r in enumerate(rows_b)}
    out, seen = [], set()
    for i, r in enumerate(rows_a):
        j = in_b.get(key(r), -1)
        out.append([i, j])
        seen.add(j)
    out += [[-1, j] for j in range(len(rows_b)) if j not in seen]
    return out


def _script_json(obj: Any) -> str:
    """JSON safe inside a <script> element (no `</` can close it early)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/").replace("<!--", "<\\!--")


def agent_colours(runs: Sequence[Run], entries: Sequence[dict[str, Any]]) -> dict[str, str]:
    """One colour per agent, the same in the charts, the turns and both runs: the team's order first,
    then agents seen only in the records."""
    out: dict[str, str] = {}
    names = [a for r in runs for a in r.agents] + [a for e in entries for a in (e["summary"].get("micro") or {}).get("agents", {})]
    for a in names:
        if a not in out:
            out[a] = PALETTE[len(out) % len(PALETTE)]
    return out


def _models(run: Run) -> dict[str, str]:
    """agent -> the model its worker group serves (the cost table's model column)."""
    out = {}
    for a in run.agents:
        wg = run.agent_wg(a)
        if wg:
            out[a] = run.wg_model(wg)
    return out


def stopped(run: Run) -> str:
    """The note of a run a spending limit stopped (its summary.json's ``run.stopped``), "" otherwise
    or when summary.json is missing or unreadable (the page is built from the records)."""
    try:
        doc = json.loads((run.path / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    stop = (doc.get("run") or {}).get("stopped") if isinstance(doc, dict) else None
    return stopped_text(stop) if isinstance(stop, dict) else ""


def run_meta(run: Run, entry: dict[str, Any]) -> str:
    """The line under a run's name, in words."""
    n = f"{run.n} sample{'s' if run.n != 1 else ''} per question"
    return (f"{workflow_name(entry['workflow'])} workflow · {run.model_label} ({run.team_label}) · {run.sampling_label}"
            f" · {n} · {len(entry['rows'])} trajectories")


def _changes(qa: dict, qb: dict) -> list[Change]:
    """`sections.changes` from the two runs' questions (`metrics.questions`)."""
    return [Change(k[0], k[1], qa[k].text, (qa[k].c, qa[k].n), (qb[k].c, qb[k].n)) for k in qa if k in qb]


def render(runs: Sequence[Run], summaries: Sequence[dict[str, Any] | None] | None = None,
           files: str | None = None, write: Callable[[str, str], None] | None = None) -> str:
    """The page for one run or two (paired) as one HTML string. With ``files`` (a folder name beside
    the page) a large page (over ``PACK_ROWS`` trajectories) keeps its detail chunks there, one small
    script each, loaded when a trajectory of that chunk is opened: each is handed to ``write(file
    name, text)`` as soon as it is made. Every run's rows and summary are made first (pass 1 of
    `view_scan`), then each run's chunks, one at a time."""
    import jinja2

    if not 1 <= len(runs) <= 2:
        raise UserError(f"view takes one run or two, got {len(runs)}")
    made = [run_entry(run, (summaries or [None] * len(runs))[i]) for i, run in enumerate(runs)]
    entries = [m[0] for m in made]
    colours = agent_colours(runs, entries)
    reports = [{"title": (("A: " if i == 0 else "B: ") if len(runs) > 1 else "") + e["name"], "meta": run_meta(run, e),
                "stopped": stopped(run),
                "html": sections.run_report(e["summary"], run.agents, colours, _models(run))}
               for i, (run, e) in enumerate(zip(runs, entries))]
    changes = (sections.changes_report(_changes(made[0][2], made[1][2]), entries[0]["name"], entries[1]["name"])
               if len(runs) > 1 else "")
    words = all_labels()  # the runs' own rules' words (a reason's, a figure's) over the built-in ones
    for e in entries:  # the page's script needs the rows, not the summary (drawn above as HTML)
        words.update(rule_words(e.pop("summary").get("compliance")))
    big = sum(len(e["rows"]) for e in entries) > PACK_ROWS
    index: dict[str, Any] = {"runs": entries, "chunk": CHUNK, "colours": colours, "labels": words,
                             "pairs": pairs(entries[0]["rows"], entries[1]["rows"] if len(entries) > 1 else None)}
    if big:  # the list's rows and pairs gzip-packed (the page opens them first); the turns beside the page
        for e in entries:
            e["rows_packed"] = _packed_parts(e.pop("rows").json_parts())
        index["pairs_packed"] = _packed(index.pop("pairs"))
        if files is not None:
            index["files"] = files
    else:
        for e in entries:
            e["rows"] = list(e["rows"])
    aside = big and files is not None and write is not None
    chunks: list[list[str]] = [[] for _ in runs]
    for r, (_, make, _) in enumerate(made):
        for ci, text in enumerate(make()):
            if aside:
                assert write is not None
                write(f"chunk-{r}-{ci}.js", f'drmasChunk("{r}-{ci}", "{text}");\n')
            else:
                chunks[r].append(text)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent), autoescape=True)
    return env.get_template(TEMPLATE).render(title=" vs ".join(e["name"] for e in entries), reports=reports,
                                             changes=changes, index=_script_json(index), chunks=chunks)


def write_view(paths: Sequence[str | Path], out: str | Path | None = None) -> Path:
    """Write the page of one or two run directories; returns its path (default RUN/view.html). A page
    of more than ``PACK_ROWS`` trajectories keeps its turns in ``<page name>_files/`` beside it
    (each chunk written as it is made, into a temporary folder that replaces an older folder of that
    name once the page is built, then the page)."""
    runs = [open_run(p) for p in paths]
    target = Path(out) if out else runs[0].path / "view.html"
    if target.suffix.lower() not in (".html", ".htm"):
        raise UserError(f"--out {target}: the page is HTML; give a file name ending in .html")
    logger.info(f"[view] {' + '.join(str(r.path) for r in runs)}: building the page")
    files = target.stem + "_files"
    target.parent.mkdir(parents=True, exist_ok=True)
    folder, tmp_folder = target.parent / files, target.parent / (files + ".tmp")
    shutil.rmtree(tmp_folder, ignore_errors=True)

    def write(name: str, text: str) -> None:
        tmp_folder.mkdir(exist_ok=True)
        (tmp_folder / name).write_text(text, encoding="ascii")

    try:
        html = render(runs, files=files, write=write)
    except BaseException:
        shutil.rmtree(tmp_folder, ignore_errors=True)
        raise
    if folder.is_dir() and not folder.is_symlink():
        shutil.rmtree(folder)
    if tmp_folder.is_dir():
        tmp_folder.replace(folder)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(html, encoding="utf-8")
    tmp.replace(target)
    return target
