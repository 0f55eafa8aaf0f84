"""The ``search_route`` protocol warm start (the ``sft:`` stage of the ``search_warmstart`` recipe):
`search_sft_examples`, the workflow's declared SFT examples (see its docstring), and the training-side
question pool it draws from (`search_train_tasks`, eval overlap removed).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import Any

from drmas_bench.benchmarks.catalog import _tasks_from_file, benchmarks_of_suite, resolve_data_dir
from drmas_bench.benchmarks.loaders import normalize_question
from drmas_bench.grading.qa import normalize_qa
from drmas_bench.retrievers import default_spec, open_retriever
from drmas_bench.types import Completion, Sampling, SFTExample, Task, UserError
from drmas_bench.workflows.base import Episode, get_workflow

#: the training-side question files (paths under the data dir): HotpotQA train and MuSiQue train
#: (100 questions each, their passages are in the mini corpus) and the NQ dev split (cut from NQ
#: train; the nq benchmark evaluates NQ test). No file the search suite evaluates is among them.
SEARCH_TRAIN_SOURCES = {
    "hotpotqa_train": "corpus/hotpotqa_train_hipporag100/hotpotqa_train.json",
    "musique_train": "corpus/musique_train_hipporag100/musique_train.json",
    "nq_dev": "qa/nq/dev.jsonl",
}
#: the evaluated benchmark each source is another split of: ids are compared within a dataset only
#: (2Wiki's "dev_0" is not NQ's "dev_0"); question texts are compared with every benchmark
SOURCE_DATASET = {"hotpotqa_train": "hotpotqa", "musique_train": "musique", "nq_dev": "nq"}
#: the sources a warm start draws from by default: the two multi-hop sets, whose passages are in the
#: mini corpus, so the answerer's gold is often in the observation it is shown. NQ dev is opt-in
#: (``sources=``): the mini corpus has no NQ passages, and an answerer taught to name a gold that no
#: passage holds learns to answer from nothing.
DEFAULT_SOURCES = ("hotpotqa_train", "musique_train")
# the verifier's, searcher's and answerer's targets: short (every token costs CPU time at eval) and
# in the protocol's format (workflows/protocol.py: valid(), search_verdict(), the action tags)
VERIFY_NO = "Nothing has been retrieved yet. <verify>no</verify>"
VERIFY_YES = "The retrieved information is enough. <verify>yes</verify>"
SEARCH_THINK = "I need to look up the facts of the question."
ANSWER_THINK = "The passages say the answer is {answer}."  # the packaged prompt's own example's pattern
YES_NO = ("yes", "no")


def _search_data_dir(data_dir: str | os.PathLike | None) -> Path:

    d = resolve_data_dir(data_dir)
    if d is None:
        raise UserError("the search warm start reads training questions from a data dir: set data.data_dir "
                        "in the recipe or DRMAS_DATA_DIR (e.g. ../shared/data)")
    lacking = [rel for rel in SEARCH_TRAIN_SOURCES.values() if not (d / rel).is_file()]
    if lacking:
        raise UserError(f"the search warm start needs {lacking[0]} under the data dir {d}")
    return d


def _question_key(question: str) -> str:
    """How two questions are compared for overlap: SQuAD-normalised text (case, punctuation, articles)."""

    return normalize_qa(question)


@lru_cache(maxsize=4)
def eval_question_keys(data_dir: str) -> tuple[dict[str, frozenset[str]], frozenset[str]]:
    """({benchmark: ids}, normalised question texts) of every search-suite benchmark file present in
    `data_dir`: the questions a warm start must never see."""

    ids: dict[str, set[str]] = {}
    texts: set[str] = set()
    for b in benchmarks_of_suite("search"):
        for rel in b.files:  # every file of the benchmark (popqa has two), not only the one eval reads
            p = Path(data_dir) / rel
            if p.is_file():
                tasks = _tasks_from_file(b, p, None)
                ids.setdefault(b.name, set()).update(t.id for t in tasks)
                texts.update(_question_key(t.question) for t in tasks)
    return {k: frozenset(v) for k, v in ids.items()}, frozenset(texts)


@lru_cache(maxsize=4)
def search_train_tasks(data_dir: str | None = None) -> tuple:
    """The warm start's question pool (`Task`s, benchmark = the source's key), from the training-side
    files only, with every question dropped whose id occurs in the evaluated split of the same
    dataset or whose normalised text occurs in any search-suite benchmark file (NQ repeats a few
    question texts across its splits)."""

    d = _search_data_dir(data_dir)
    eval_ids, eval_texts = eval_question_keys(str(d))
    rows: list[Task] = []
    for rec in json.loads((d / SEARCH_TRAIN_SOURCES["hotpotqa_train"]).read_text(encoding="utf-8")):
        rows.append(Task(rec["_id"], "hotpotqa_train", normalize_question(rec["question"]), [rec["answer"]]))
    for rec in json.loads((d / SEARCH_TRAIN_SOURCES["musique_train"]).read_text(encoding="utf-8")):
        if rec.get("answerable", True):
            rows.append(Task(rec["id"], "musique_train", normalize_question(rec["question"]),
                             [rec["answer"], *rec.get("answer_aliases", [])]))
    with open(d / SEARCH_TRAIN_SOURCES["nq_dev"], encoding="utf-8") as f:
        for line in f:
            if line.strip():
                rec = json.loads(line)
                rows.append(Task(str(rec["id"]), "nq_dev", normalize_question(rec["question"]),
                                 [str(a) for a in rec["golden_answers"]]))
    return tuple(t for t in rows if t.answers and t.answers[0].strip()
                 and t.id not in eval_ids.get(SOURCE_DATASET[t.benchmark], ())
                 and _question_key(t.question) not in eval_texts)


class _ScriptedTeam:
    """An `AgentBackend` that answers each call with the warm start's target, so the examples come
    from the workflow itself (its prompts, history, team context, observations), not a copy of it.

    The script of one episode: the verifier says no while nothing has been retrieved and yes after
    that; the searcher searches the question; the answerer writes the first gold answer."""

    def __init__(self, question: str, gold: str):
        self.question, self.gold = question, gold
        self.verifier_calls = 0

    def worker_group(self, agent: str) -> str:
        return "script"

    def sampling(self, agent: str):

        return Sampling()

    async def generate(self, agent: str, request):

        if agent == "verifier":
            self.verifier_calls += 1
            text = VERIFY_NO if self.verifier_calls == 1 else VERIFY_YES
        elif agent == "searcher":
            text = f"<think>{SEARCH_THINK}</think><search>{self.question.rstrip('?').strip()}</search>"
        else:
            text = f"<think>{ANSWER_THINK.format(answer=self.gold)}</think><answer>{self.gold}</answer>"
        return Completion(text)


@lru_cache(maxsize=2)
def _open_search_retriever(spec: str | None, data_dir: str) -> Any:

    return open_retriever(spec or default_spec(data_dir))


async def _scripted_turns(tasks: list[Any], retriever: Any, workflow_options: dict[str, Any] | None) -> list[list]:
    """The turns of a scripted `search_route` episode on each of ``tasks`` (verifier no, searcher,
    verifier yes, answerer), one after another on one event loop: each turn's request is what the
    rollout would show the agent there."""

    wf = get_workflow("search_route")
    out = []
    for task in tasks:
        ep = Episode(task, 0, _ScriptedTeam(task.question, task.answers[0]), wf.agents, retriever=retriever)
        await wf.fn(ep, **(workflow_options or {}))
        out.append(ep.turns)
    return out


def _run_apart(coro: Any) -> Any:
    """Run a coroutine to its end from plain code, also when called inside a running event loop
    (the trainer's warm start is async): on a thread of its own with its own loop."""

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def draw_search_questions(pool: list[Any], n: int, seed: int, *, yes_no_share: float,
                          first_verdict_share: float) -> list[tuple[Any, bool]]:
    """The ``n`` questions of `search_sft_examples` drawn from ``pool``, each with whether its
    verifier example is the first verdict: the draw alone, by ``random.Random(seed)``."""

    apart = yes_no_share > 0  # 0: yes/no questions stay in their sources, at their natural share
    by_source: dict[str, list[Any]] = {}
    for t in pool:
        yn = apart and t.answers[0].strip().lower() in YES_NO
        by_source.setdefault("yes/no" if yn else t.benchmark, []).append(t)
    sources = sorted(k for k in by_source if k != "yes/no")
    rng = random.Random(seed)
    queues: dict[str, list[Any]] = {k: [] for k in by_source}
    drawn: list[tuple[Any, bool]] = []  # (question, whether the verifier's example is its first verdict)
    for _ in range(n):
        # equal shares of the sources (NQ alone would outnumber the multi-hop sets 40:1), yes/no apart
        src = "yes/no" if "yes/no" in by_source and rng.random() < yes_no_share else rng.choice(sources)
        if not queues[src]:
            queues[src] = list(by_source[src])
            rng.shuffle(queues[src])
        # the step-1 verdict (search first) in 2 of 3 verifier examples: a verifier that answers before
        # any search ends the episode on nothing; one that asks for a second search only costs a step
        drawn.append((queues[src].pop(), rng.random() < first_verdict_share))
    return drawn


def search_sft_examples(agents: list[str], n: int, seed: int = 0, *, data_dir: str | os.PathLike | None = None,
                        retriever: str | None = None, workflow_options: dict[str, Any] | None = None,
                        sources: tuple[str, ...] = DEFAULT_SOURCES, yes_no_share: float = 0.15,
                        first_verdict_share: float = 2 / 3, **_: Any) -> list[SFTExample]:
    """``n`` examples per agent in ``agents`` (verifier, searcher, answerer) of the ``search_route``
    protocol warm start (a 135M model never writes the tags on its own).

    Each example is one call of a scripted episode run through the workflow itself
    (`_scripted_turns`): the packaged prompts, the real BM25 passages of the mini corpus for the
    observation (``retriever``: a spec, else the default index of ``data_dir``), and a target in the
    protocol's format: the verifier's ``<verify>no</verify>`` before any search and
    ``<verify>yes</verify>`` after one (``first_verdict_share`` of them the first), the searcher's
    ``<think>..</think><search>QUESTION</search>``,
    the answerer's ``<think>..</think><answer>GOLD</answer>``. So the warm-started team searches once
    and then answers; the format is what is taught, not knowledge (the golds of NQ questions are often
    not in the mini corpus).

    Questions come from `search_train_tasks` only (training-side files, eval overlap removed), of
    ``sources`` (default `DEFAULT_SOURCES`): each episode picks a source (equal shares), then the next
    question of that source's shuffled pass, by ``random.Random(seed)``; the same seed gives the same
    examples. Questions answered yes / no (HotpotQA's comparisons: 9 of its 100) are a queue of their
    own, drawn with probability ``yes_no_share``: at their natural share (~4 %) a handful of examples
    would never teach the answerer that such a question is answered "yes" or "no". The toy
    options the trainer passes to every maker are ignored."""
    unknown = sorted(set(agents) - {"verifier", "searcher", "answerer"})
    if unknown:
        raise ValueError(f"the search_route warm start knows the agents verifier, searcher and answerer, "
                         f"not {', '.join(unknown)}")
    unknown = sorted(set(sources) - set(SEARCH_TRAIN_SOURCES))
    if unknown or not sources:
        raise ValueError(f"search warm-start sources are {', '.join(SEARCH_TRAIN_SOURCES)}, not {', '.join(unknown) or 'none'}")
    pool = [t for t in search_train_tasks(None if data_dir is None else str(data_dir)) if t.benchmark in sources]
    ret = _open_search_retriever(retriever, str(_search_data_dir(data_dir)))
    drawn = draw_search_questions(pool, n, seed, yes_no_share=yes_no_share, first_verdict_share=first_verdict_share)
    # the episodes one after another on one thread's event loop, not a thread and a loop each
    episodes = _run_apart(_scripted_turns([t for t, _ in drawn], ret, workflow_options))
    out: list[SFTExample] = []
    for (_, first), turns in zip(drawn, episodes):
        verifier = [t for t in turns if t.agent == "verifier"]
        pick = {"verifier": verifier[0] if first else verifier[-1]}
        pick.update((t.agent, t) for t in turns if t.agent != "verifier")
        for agent in agents:
            t = pick[agent]
            out.append(SFTExample(agent, t.request.messages, t.completion.text))
    return out

