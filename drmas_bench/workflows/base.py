"""What a workflow sees: an `Episode` (one task, one sample) whose agents it can call.

    async def my_workflow(ep: Episode) -> None:
        turn = await ep.solver([{"role": "user", "content": ep.task.question}])
        ep.final_answer = turn.text

`ep.<agent>(messages)` sends one request to the engine serving that agent, records the call as a
`Turn` (agent, worker group, step, request, completion, validity) and returns it. The request's
seed is derived from (run seed, benchmark, task id, sample index, step), so a sample's text does not
depend on what else was batched with it: a resumed run reproduces an uninterrupted one.

Adding a workflow = one module with a function decorated by `@workflow(...)`, imported in
`drmas_bench/workflows/__init__.py`.
"""

from __future__ import annotations

import hashlib
import inspect
import time
from dataclasses import dataclass, field, replace
from typing import Any, Awaitable, Callable, Protocol

from drmas_bench.types import Completion, Request, Sampling, Task, Trajectory, Turn, UserError


class AgentBackend(Protocol):
    """How an episode reaches a model: the team runtime implements this."""

    def worker_group(self, agent: str) -> str: ...

    def sampling(self, agent: str) -> Sampling: ...

    async def generate(self, agent: str, request: Request) -> Completion: ...


@dataclass
class WorkflowSpec:
    name: str
    fn: Callable[..., Awaitable[None]]
    agents: tuple[str, ...]  # logical agents, in the order they first speak
    grader: str  # "math" | "qa" | "toy"
    needs_retriever: bool = False
    defaults: dict[str, Any] = field(default_factory=dict)  # keyword options and their defaults


WORKFLOWS: dict[str, WorkflowSpec] = {}


def workflow(name: str, agents: tuple[str, ...], grader: str, needs_retriever: bool = False):
    """Register an episode function ``fn(ep, **options)`` under ``name``.

    Options:
        agents: the logical agents, in the order they first speak.
        grader: "math" | "qa" | "toy".
        needs_retriever: the workflow searches (the runner loads a retriever).

    The workflow's options and their defaults are read from ``fn``'s keyword parameters (those
    after the episode, each with a default), so they are written once, in the signature."""

    def deco(fn):
        if name in WORKFLOWS:
            raise ValueError(f"workflow {name!r} registered twice")
        WORKFLOWS[name] = WorkflowSpec(name, fn, agents, grader, needs_retriever, signature_defaults(fn))
        return fn

    return deco


def signature_defaults(fn: Callable[..., Any]) -> dict[str, Any]:
    """``{option: default}`` of ``fn``'s parameters after the first (the episode); every one must have
    a default (a workflow is called with only the options a user set)."""
    params = list(inspect.signature(fn).parameters.values())[1:]
    missing = [p.name for p in params if p.default is inspect.Parameter.empty
               and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if missing:
        raise ValueError(f"workflow {fn.__name__}: option(s) {', '.join(missing)} need a default")
    return {p.name: p.default for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def get_workflow(name: str) -> WorkflowSpec:
    """The registered workflow ``name``. The built-ins are registered by the package's ``__init__``,
    which Python runs before this module, so importing from here never needs an import back."""
    if name not in WORKFLOWS:
        raise UserError(f"unknown workflow {name!r}; known: {', '.join(WORKFLOWS)}")
    return WORKFLOWS[name]


def check_workflow_options(wf: WorkflowSpec, options: dict) -> None:
    """``workflow_options`` (a team file's, a recipe's) must be keyword parameters of the workflow
    function, of the type of their defaults: one UserError naming the key, before any model loads
    rather than a traceback in the first episode. Eval and the trainer both call this one."""
    params = list(inspect.signature(wf.fn).parameters.values())[1:]  # the first is the Episode
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    known = sorted(p.name for p in params if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD))
    unknown = sorted(str(k) for k in options if k not in known)
    if unknown:
        raise UserError(f"workflow_options: unknown option(s) {', '.join(unknown)} for workflow {wf.name!r}; "
                        f"its options: {', '.join(known) or 'none'}")
    for k, v in options.items():
        default = wf.defaults.get(k)
        if default is not None and not isinstance(v, type(default)) and not (
                isinstance(default, float) and isinstance(v, int) and not isinstance(v, bool)):
            raise UserError(f"workflow_options.{k}: expected {type(default).__name__} (like the default {default!r}), got {v!r}")


def derive_seed(*parts: Any) -> int:
    """A stable 31-bit seed from any values (independent of Python's hash randomisation)."""
    h = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(h[:4], "little") & 0x7FFFFFFF


class Episode:
    """One run of a workflow on one task (one of its n samples)."""

    def __init__(self, task: Task, sample_idx: int, backend: AgentBackend, agents: tuple[str, ...],
                 seed: int = 0, retriever: Any = None, want_logprobs: bool = False):
        self.task = task
        self.traj = Trajectory(task=task, sample_idx=sample_idx)
        self.retriever = retriever
        self._backend = backend
        self._agents = agents
        self._seed = seed
        self._want_logprobs = want_logprobs
        self._prompt_limit: tuple[int | None, str] = (None, "left")
        self._t0 = time.perf_counter()

    def limit_prompts(self, max_prompt_tokens: int | None, truncate: str = "left") -> None:
        """Every later request carries this prompt-length limit (None = none) and truncation side;
        the engine applies the cut and reports it in `Completion.prompt_truncated`."""
        self._prompt_limit = (max_prompt_tokens, truncate)

    # the trajectory's fields a workflow writes
    @property
    def turns(self) -> list[Turn]:
        return self.traj.turns

    @property
    def final_answer(self) -> str | None:
        return self.traj.final_answer

    @final_answer.setter
    def final_answer(self, value: str | None) -> None:
        self.traj.final_answer = value

    async def call(self, agent: str, messages: list[dict[str, str]]) -> Turn:
        if agent not in self._agents:
            raise UserError(f"workflow called unknown agent {agent!r}; team agents: {', '.join(self._agents)}")
        step = len(self.traj.turns)
        sampling = replace(self._backend.sampling(agent),
                           seed=derive_seed(self._seed, self.task.benchmark, self.task.id, self.traj.sample_idx, step))
        limit, side = self._prompt_limit
        req = Request(agent=agent, messages=messages, sampling=sampling, want_logprobs=self._want_logprobs,
                      max_prompt_tokens=limit, truncate=side, sample_idx=self.traj.sample_idx)
        completion = await self._backend.generate(agent, req)
        turn = Turn(agent=agent, wg=self._backend.worker_group(agent), step=step, request=req, completion=completion)
        self.traj.turns.append(turn)
        return turn

    def __getattr__(self, name: str) -> Callable[[list[dict[str, str]]], Awaitable[Turn]]:
        # ep.solver(messages) == ep.call("solver", messages)
        if name.startswith("_") or name not in self.__dict__.get("_agents", ()):
            raise AttributeError(name)
        return lambda messages: self.call(name, messages)

    def finish(self) -> Trajectory:
        self.traj.wall_s = time.perf_counter() - self._t0
        return self.traj


# ------------------------------------------------------------------------------ shared helpers


def chat(system: str, user: str) -> list[dict[str, str]]:
    """A role-specific system message + the user message (the toy workflow's layout; the paper's
    workflows use `protocol.chat`, REFERENCE §2b)."""
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]
