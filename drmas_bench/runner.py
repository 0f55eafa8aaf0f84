"""Run many episodes concurrently, grade them, and append them to a run directory.

Up to `concurrency` episode coroutines run at once; each agent call awaits its engine, whose
micro-batcher gathers whatever is pending into one batched forward. Episodes are made one by one as
slots free (never the whole run up front), so memory does not grow with the run's size. Finished
trajectories go to a ``Recorder``, whose own threads grade them and append them in batches of
`flush_every` (at most 64) or once the oldest has waited `flush_s` (at most 1 s), and then drop them;
retrievals keep asyncio's default thread pool, so they never delay a write. A kill therefore loses at
most the episodes in flight plus those in the recorder's two queues (no episode starts while
``MAX_UNWRITTEN`` finished ones wait, so at most ``MAX_UNWRITTEN`` + `concurrency` in all), which a
re-run recomputes identically (per-request seeds).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from drmas_bench.agents.team import TeamSpec
from drmas_bench.benchmarks.catalog import BENCHMARKS, known_names
from drmas_bench.calls import CallChain
from drmas_bench.grading.families import grade_family
from drmas_bench.limits import LimitReached
from drmas_bench.recorder import Recorder
from drmas_bench.run_dir import RunDir
from drmas_bench.types import Completion, Request, Sampling, Task, Trajectory
from drmas_bench.workflows.base import Episode, WorkflowSpec

# a finished episode is on disk within MAX_FLUSH_S seconds or MAX_FLUSH_EVERY episodes (a smaller
# flush_every / flush_s wins); no new episode starts while MAX_UNWRITTEN finished ones wait for the disk
MAX_FLUSH_EVERY = 64
MAX_FLUSH_S = 1.0
MAX_UNWRITTEN = 64


class TeamRuntime:
    """Serves a TeamSpec: one engine per worker group, shared by the agents mapped to it.

    `engines` maps worker-group name -> an engine with ``async generate(list[Request])``. A pool
    (drmas_bench.pool) may stand in for the dict to wake / sleep engines on demand.
    """

    def __init__(self, team: TeamSpec, engines: dict[str, Any], default_sampling: Sampling):
        self.team = team
        self.engines = engines
        self._sampling = {a: team.sampling_for(a, default_sampling) for a in team.agents}

    def worker_group(self, agent: str) -> str:
        return self.team.agents[agent]

    def sampling(self, agent: str) -> Sampling:
        return self._sampling[agent]

    async def generate(self, agent: str, request: Request) -> Completion:
        engine = self.engines[self.team.agents[agent]]
        return (await engine.generate([request]))[0]


class _CountingRuntime:
    """What the episodes of one `run_episodes` call talk to: the runtime, plus a callback after each
    finished call. Episodes batched together advance in lockstep and finish together at the end, so
    a bar that only counted finished episodes would sit at 0 for most of the run."""

    def __init__(self, runtime: Any, on_call: Callable[[Completion], None]):
        self._runtime = runtime
        self._on_call = on_call

    def sampling(self, agent: str) -> Sampling:
        return self._runtime.sampling(agent)

    def worker_group(self, agent: str) -> str:
        return self._runtime.worker_group(agent)

    async def generate(self, agent: str, request: Request) -> Completion:
        completion = await self._runtime.generate(agent, request)
        self._on_call(completion)
        return completion


@dataclass
class RunStats:
    episodes: int = 0
    skipped: int = 0
    tokens: int = 0
    wall_s: float = 0.0
    engine_calls: int = 0
    errors: list[str] = field(default_factory=list)
    stopped: dict[str, Any] | None = None  # a run limit stopped the run (drmas_bench.limits: summary.json's run.stopped)
    limits: dict[str, Any] | None = None  # the limits and what was used (summary.json's run.limits), when set


def grade_trajectories(trajs: list[Trajectory], family: str, timeout_s: float = 5.0,
                       math_grader: str | None = None,
                       round1_answer: Callable[[Trajectory], str | None] | None = None) -> None:
    """Fill reward / correct / extra of finished trajectories, each by its benchmark's grading family
    (``Benchmark.family``, grading.graders.FAMILIES; math in a process pool with timeouts).

    family: the grading family of trajectories whose benchmark is not in the registry (a trainer's task file):
    the workflow's; math_grader: the math grader's name in `grading.GRADERS` (default
    `grading.DEFAULT_GRADER`). round1_answer: the workflow's `WorkflowSpec.round1_answer`; the
    round-1 answer it reads from a trajectory (one a later round replaced) is graded by the same
    family in the same batch (extra round1_correct, round1_grade): the workflow's effects need it
    (math_refine's verifier effect), and only here is the run's grader at hand."""

    known_names()  # the suites are registered
    by_family: dict[str, list[Trajectory]] = {}
    for t in trajs:
        b = BENCHMARKS.find(t.task.benchmark)
        by_family.setdefault(b.family if b is not None else family, []).append(t)
    for family, group in by_family.items():
        pairs = [(t.final_answer, t.task.answers) for t in group]
        # a round-1 answer that a later round replaced (None: the final answer is round 1's)
        firsts: list[tuple[int, str]] = []
        for i, t in enumerate(group if round1_answer is not None else []):
            first = round1_answer(t)
            if first is not None:
                firsts.append((i, first))
        graded = grade_family(family, pairs + [(text, group[i].task.answers) for i, text in firsts], timeout_s, math_grader)
        for t, (correct, extra) in zip(group, graded):
            t.reward = 1.0 if correct else 0.0  # the one outcome; t.correct derives from it
            t.extra.update(extra)
        for (i, _), (correct, extra) in zip(firsts, graded[len(group):]):
            group[i].extra["round1_correct"] = correct
            group[i].extra["round1_grade"] = extra.get("grade")


@dataclass
class EpisodeRun:
    """What ``run_episodes`` runs the episodes with: the team's runtime, the workflow and its options,
    where finished trajectories go, and how (the call chain's gate and prices, concurrency, flushing).

    store: the run directory (None: the trainer's rollouts, handed to ``on_finished`` only);
    calls: the run's ``calls.CallChain`` (its meter gates each episode's start, its price sheet sets
    each trajectory's ``cost_usd``), None: no limits, no prices; math_grader: the math grader's name
    (default ``grading.DEFAULT_GRADER``; other families ignore it); step: the training step, part of
    every sampling seed (``workflows.base.sample_seed``; 0 outside training)."""

    runtime: Any  # a TeamRuntime (or anything with its generate / sampling / worker_group)
    workflow: WorkflowSpec
    store: RunDir | None = None
    seed: int = 0
    step: int = 0
    retriever: Any = None
    workflow_options: dict[str, Any] = field(default_factory=dict)
    calls: CallChain | None = None
    concurrency: int = 256
    flush_every: int = 32  # a finished trajectory is written within flush_every episodes or flush_s seconds
    flush_s: float = 1.0  # (at most MAX_FLUSH_EVERY / MAX_FLUSH_S, whatever is asked)
    progress: bool = True
    want_logprobs: bool = False
    on_finished: Callable[[list[Trajectory]], None] | None = None
    math_grader: str | None = None
    # episodes played elsewhere (drmas_bench.split: worker processes or Ray actors): ``await
    # remote.play(task, idx)`` returns the finished, ungraded trajectory; None: played here on `runtime`
    remote: Any = None


async def play(ctx: EpisodeRun, backend: Any, task: Task, idx: int) -> Trajectory:
    """One episode of ``ctx.workflow`` on (task, sample ``idx``) through ``backend`` (the runtime, or a
    view of it): the finished trajectory, not graded. The one way an episode is played, in this process
    or in a split run's worker (``drmas_bench.split``), so both record the same trajectory."""
    wf = ctx.workflow
    ep = Episode(task, idx, backend, wf.agents, seed=ctx.seed, retriever=ctx.retriever,
                 want_logprobs=ctx.want_logprobs, training_step=ctx.step)
    await wf.fn(ep, **{**wf.defaults, **ctx.workflow_options})
    return ep.finish()


def eval_run(p: Any, runtime: Any, store: RunDir | None, retriever: Any, calls: CallChain | None,
             **more: Any) -> EpisodeRun:
    """The ``EpisodeRun`` of an evaluation plan ``p`` (``drmas_bench.plan.Plan``): its workflow, seed,
    workflow and prompt options, concurrency, flushing, progress and grader; ``more``: fields to set
    besides (``remote``, a wider ``concurrency``)."""
    cfg = p.cfg
    fields = dict(seed=cfg.seed, retriever=retriever, workflow_options={**p.team.workflow_options, **p.protocol_opts},
                  calls=calls, concurrency=cfg.concurrency, flush_every=cfg.flush_every, progress=cfg.progress,
                  math_grader=cfg.grader)
    return EpisodeRun(runtime, p.wf, store, **{**fields, **more})


class _EpisodeLoop:
    """The moving parts of one ``run_episodes`` call, in the order an episode meets them: ``start_episodes``
    fills the window from ``todo`` (made as slots free), ``play_one`` plays an episode behind the run's
    gate, ``finished_one`` / ``take`` hand each finished one to the recorder (grading and writing on its
    threads), and ``stop`` cancels what still runs and writes everything that finished."""

    def __init__(self, ctx: EpisodeRun, todo: Iterator[tuple[Task, int]], todo_count: int, stats: RunStats):
        from tqdm import tqdm

        self.ctx, self.todo, self.stats = ctx, todo, stats
        self.gate = ctx.calls.meter if ctx.calls is not None else None
        self.t0 = time.perf_counter()
        self.width = max(1, ctx.concurrency)
        self.bar = tqdm(total=todo_count, desc="episodes", unit="ep", disable=not ctx.progress, dynamic_ncols=True)
        self.calls, self.call_tokens, self.last_shown = 0, 0, 0.0
        self.backend = _CountingRuntime(ctx.runtime, self.on_call) if ctx.progress else ctx.runtime
        store = ctx.store
        write = (lambda batch: store.append(batch, with_tokens=ctx.want_logprobs)) if store is not None else None
        self.recorder = Recorder(self.grade, write, flush_every=min(ctx.flush_every, MAX_FLUSH_EVERY),
                                 flush_s=min(ctx.flush_s, MAX_FLUSH_S), max_unwritten=MAX_UNWRITTEN,
                                 after_write=ctx.on_finished)
        self.finished: deque[asyncio.Future] = deque()  # done episodes, in the order they finished
        self.wake = asyncio.Event()
        self.running: set[asyncio.Future] = set()
        self.exhausted = False  # every (task, sample) has been started

    def show(self, force: bool = False) -> None:
        now = time.perf_counter()
        if force or now - self.last_shown >= 0.5:  # a refresh per call would flood a log file
            self.last_shown = now
            self.bar.set_postfix(calls=self.calls, tok_s=f"{self.call_tokens / max(now - self.t0, 1e-9):.0f}",
                                 refresh=True)

    def on_call(self, c: Completion) -> None:
        self.calls += 1
        self.call_tokens += c.completion_tokens
        self.show()

    async def play_one(self, task: Task, idx: int) -> Trajectory | None:
        ctx, gate = self.ctx, self.gate
        traj, started = None, False
        try:
            if gate is not None:
                await gate.start_episode()
                started = True
            if ctx.remote is None:
                traj = await play(ctx, self.backend, task, idx)
            else:  # played by a worker: its calls count for the bar when it comes back
                traj = await ctx.remote.play(task, idx)
                for tu in traj.turns if ctx.progress else ():
                    self.on_call(tu.completion)
        except LimitReached as e:  # no call starts past a limit: this episode is abandoned, never written half
            self.stats.stopped = self.stats.stopped or e.stop
        finally:
            if started and gate is not None:
                await gate.end_episode(traj)
        return traj

    def grade(self, batch: list[Trajectory]) -> None:  # the recorder's grader thread
        ctx, wf = self.ctx, self.ctx.workflow
        grade_trajectories(batch, wf.family, 5.0, ctx.math_grader, wf.round1_answer)
        if ctx.calls is not None and ctx.calls.prices is not None:
            for t in batch:
                t.cost_usd = ctx.calls.cost(t)

    def start_episodes(self) -> None:
        """Start episodes while the window has room and the recorder is not too far behind."""
        while not self.exhausted and len(self.running) < self.width and self.recorder.unwritten < MAX_UNWRITTEN:
            nxt = next(self.todo, None)
            if nxt is None:
                self.exhausted = True
                break
            fut = asyncio.ensure_future(self.play_one(*nxt))
            fut.add_done_callback(self.finished_one)
            self.running.add(fut)

    def finished_one(self, fut: asyncio.Future) -> None:
        self.finished.append(fut)
        self.wake.set()

    def take(self, fut: asyncio.Future) -> None:
        self.running.discard(fut)
        if fut.cancelled():
            return
        traj = fut.result()  # an episode's error is raised here, after what finished before it is kept
        if traj is None:  # abandoned at a run limit
            return
        self.recorder.put(traj)
        self.stats.episodes += 1
        self.stats.tokens += sum(tu.completion.completion_tokens for tu in traj.turns)
        self.stats.engine_calls += len(traj.turns)
        self.show(force=True)
        self.bar.update(1)

    async def run(self) -> None:
        """Keep the window full until every episode has started and finished."""
        while True:
            self.start_episodes()
            if not self.running and self.exhausted:
                return
            if not self.running:  # the window is full of unwritten work: wait for the writer
                await self.recorder.room()
                continue
            await self.wake.wait()
            self.wake.clear()
            while self.finished:
                self.take(self.finished.popleft())

    async def stop(self) -> None:
        """After the loop, however it ended (done, an episode's error, a stop): cancel what still runs
        and write every episode that finished."""
        for p in self.running:
            p.cancel()
        await asyncio.gather(*self.running, return_exceptions=True)
        # episodes that finished while the loop waited elsewhere (a failed episode, a stop)
        for ended in dict.fromkeys(self.finished):
            if ended.done() and not ended.cancelled() and ended.exception() is None and ended.result() is not None:
                self.recorder.put(ended.result())
        self.finished.clear()
        try:
            await self.recorder.finish()  # every episode that finished is written, also when another failed or the run was stopped
        finally:
            self.bar.close()
            self.stats.wall_s = time.perf_counter() - self.t0


async def run_episodes(tasks: list[Task], n: int, ctx: EpisodeRun) -> RunStats:
    """Run every (task, sample) not yet in ``ctx.store``; return counters. Raises the first episode
    error after saving everything that finished before it. An episode stopped by a run limit
    (``limits.LimitReached``, raised before a call) is abandoned, not an error: the others run on
    until they finish or reach a call themselves, and ``stats.stopped`` says which limit."""
    store = ctx.store
    done = store.done_keys() if store is not None else set()
    total = len(tasks) * n
    todo_count = total - sum(1 for t in tasks for i in range(n) if (t.benchmark, t.id, i) in done) if done else total
    todo = ((t, i) for t in tasks for i in range(n) if (t.benchmark, t.id, i) not in done)  # made as slots free
    stats = RunStats(skipped=total - todo_count)
    loop = _EpisodeLoop(ctx, todo, todo_count, stats)
    try:
        await loop.run()
    finally:
        await loop.stop()
    return stats
