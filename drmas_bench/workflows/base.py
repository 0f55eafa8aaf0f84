"""What a workflow sees: an `Episode` (one task, one sample) whose agents it can call.

    async def my_workflow(ep: Episode) -> None:
        turn = await ep.solver([{"role": "user", "content": ep.task.question}])
        ep.final_answer = turn.text

`ep.<agent>(messages)` sends one request to the engine serving that agent, records the call as a
`Turn` (agent, worker group, step, request, completion, validity) and returns it. The request's
seed is `sample_seed(run seed, training step, prompt, sample index, agent, turn)`, so a sample's
text does not depend on what else was batched with it (a resumed run reproduces an uninterrupted
one) and the n samples of one prompt (GRPO's group) never share a seed.

Adding a workflow = one module with a function decorated by `@workflow(...)` inside a suite folder
(``drmas_bench/suites/<suite>/``, found by `drmas_bench.suites.discovery`; docs/architecture.md).
"""

from __future__ import annotations

import hashlib
import inspect
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Awaitable, Callable, Protocol

from drmas_bench.figures import Effects, as_effects, labels_of, rule_labels
from drmas_bench.records import RecordView
from drmas_bench.registry import DeclarationError, Registry
from drmas_bench.suites.discovery import discover, discovered, where
from drmas_bench.types import Completion, Request, Sampling, SFTExample, Task, Trajectory, Turn, UserError
from drmas_bench.workflows.rules import RULES, FormatRule, Rule, as_rule


class AgentBackend(Protocol):
    """How an episode reaches a model: the team runtime implements this."""

    def worker_group(self, agent: str) -> str: ...

    def sampling(self, agent: str) -> Sampling: ...

    async def generate(self, agent: str, request: Request) -> Completion: ...


# A workflow's effects: `figures.Effects` (the summary block's key, a function over its records, each
# a `records.RecordView`, returning the block, and the figures it declares; the workflow's module
# defines it). A plain (key, fn) pair is accepted too.
# A warm start's example maker: ``fn(agents, n, seed, **the recipe's sft options)`` -> n examples per
# agent in agents (options it has no use for are ignored).
SFTMaker = Callable[..., list[SFTExample]]


@dataclass
class WorkflowSpec:
    name: str
    fn: Callable[..., Awaitable[None]]
    agents: tuple[str, ...]  # logical agents, in the order they first speak
    family: str  # the grading family: "math" | "qa" | "toy"
    needs_retriever: bool = False
    defaults: dict[str, Any] = field(default_factory=dict)  # keyword options and their defaults
    rules: dict[str, FormatRule] = field(default_factory=dict)  # agent -> the format rule its responses must pass
    effects: Effects | None = None
    # role prompt -> (placeholders it may use, those it must use) of the packaged
    # ``<name>.prompts.yaml``; empty: the workflow has no prompt templates (`protocol.Templates`)
    placeholders: dict[str, tuple[set[str], set[str]]] = field(default_factory=dict)
    prompt_limit: tuple[int, str] = (0, "left")  # (prompt-length limit in tokens, 0 = none; the side cut)
    sft: SFTMaker | None = None  # the examples of its supervised warm start (None: it has none)
    # an episode's round-1 answer when a later round replaced it (None: the final answer is round 1's),
    # graded beside the final answer by the same family (extra round1_correct; `runner.grade_trajectories`)
    round1_answer: Callable[[Trajectory], str | None] | None = None
    # the agent whose turn opens each env step (``extra["env"]``: the viewer numbers the steps by it
    # and shows each step's env record); None: the workflow's env steps are not shown per turn
    env_step_agent: str | None = None
    title: str = ""  # how a caption names it ("math refinement"); "": its name
    labels: dict[str, str] = field(default_factory=dict)  # the words a reader sees for its effects' keys
    prompts_file: Path | None = None  # its packaged ``<name>.prompts.yaml``, beside its module (None: no templates)
    # the kind of each env step of one episode (search | empty | answer | end), from its env record or,
    # for older records, its turns: the viewer's searches per trajectory; None: the workflow has no env
    env_step_kinds: Callable[[RecordView], list[str]] | None = None
    # figures of one stored record (a dict) that its effects read from text a compact record drops
    # (the prompts, the env's observations: drmas_bench.compact), computed once when the record is stored
    record_figures: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        if self.effects is not None:  # a plain (key, fn) pair, or Effects with its figures checked
            self.effects = as_effects(self.effects)

    def effect_labels(self) -> dict[str, str]:
        """{key: words} of its effects block: its declared figures in order, then its ``labels``."""
        declared = labels_of(self.effects.figures) if self.effects is not None else {}
        return {**declared, **{k: v for k, v in self.labels.items() if k not in declared}}

    def rule_labels(self) -> dict[str, str]:
        """{key: words} its agents' format rules declare (reasons and figures; `figures.rule_labels`)."""
        return rule_labels(self.rules.values())


WORKFLOWS: Registry[WorkflowSpec] = Registry("workflow", filled_by_suites=True)


def workflow(name: str, agents: tuple[str, ...], family: str | None = None, needs_retriever: bool = False,
             rules: dict[str, Rule] | None = None, effects: Effects | None = None,
             placeholders: dict[str, tuple[set[str], set[str]]] | None = None,
             prompt_limit: tuple[int, str] = (0, "left"), sft: SFTMaker | None = None,
             round1_answer: Callable[[Trajectory], str | None] | None = None,
             env_step_agent: str | None = None, grader: str | None = None, title: str = "",
             labels: dict[str, str] | None = None, env_step_kinds: Callable[[RecordView], list[str]] | None = None,
             record_figures: Callable[[dict[str, Any]], dict[str, Any]] | None = None):
    """Register an episode function ``fn(ep, **options)`` under ``name``.

    Options:
        agents: the logical agents, in the order they first speak.
        family: the grading family, "math" | "qa" | "toy" (``grader=`` is accepted too, for workflow
            modules that name it so; elsewhere "grader" means a math grader, ``--grader``).
        needs_retriever: the workflow searches (the runner loads a retriever).
        rules: {agent: format rule} that compliance checks each agent's responses against (a
            `rules.FormatRule`, a name registered with `rules.format_rule`, or a bare function
            text -> reasons it fails).
        effects: ``Effects(key, fn, figures=[Figure(key, label, format), ...], phrase=..., note=...)``
            (`drmas_bench.figures`; a bare ``(key, fn)`` pair declares no figures): ``fn(records)``
            (a list of `records.RecordView`) returns the workflow's block of the summary's effects,
            stored under ``key`` for the whole run and per benchmark; its figures' labels and
            formats are what every report shows (summary.json stores the labels).
        placeholders: {role: (allowed, required)} placeholders of each prompt in the workflow's
            packaged ``<name>.prompts.yaml`` (a prompts file is checked against them); None: the
            workflow has no prompt templates.
        prompt_limit: (max prompt tokens, 0 = none; the truncation side, left | middle | right) when
            the run sets neither (`protocol.ProtocolOptions.resolve`).
        sft: the example maker of the workflow's supervised warm start (the trainer's ``sft:`` stage).
        round1_answer: ``fn(trajectory)`` -> the round-1 answer a later round replaced, or None; the
            run grades it too (``extra["round1_correct"]``), for the workflow's effects.
        env_step_agent: the agent whose turn opens each step of the env the workflow records in
            ``extra["env"]`` (the viewer shows the steps).
        env_step_kinds: ``fn(record)`` -> the kind of each env step of one episode (search | empty
            | answer | end; the viewer counts each trajectory's searches).
        record_figures: ``fn(record)`` -> {name: figure} its effects read from the prompts or the
            env's observations, which the compact copy of a record drops (``drmas_bench.compact``
            keeps them under ``"figures"``; the effects read them back from there).
        title: how captions name the workflow (default: its name).
        labels: {key: words} of keys its effects block adds beyond its declared figures (a label
            ending in "(%)" marks a share, "(pts)" points).

    Its packaged prompt templates, when it declares ``placeholders``, are the file
    ``<name>.prompts.yaml`` beside the module that defines ``fn``.
    The workflow's options and their defaults are read from ``fn``'s keyword parameters (those
    after the episode, each with a default), so they are written once, in the signature."""

    if (family is None) == (grader is None):
        raise DeclarationError(f"workflow {name!r}: name its grading family once (family=...)")
    fam: str = family if family is not None else str(grader)

    def deco(fn):
        prompts_file = Path(inspect.getfile(fn)).with_name(f"{name}.prompts.yaml") if placeholders else None
        defaults = signature_defaults(fn)
        takes_any = any(p.kind is p.VAR_KEYWORD for p in inspect.signature(fn).parameters.values())
        lacking = [o for o in TEMPLATE_OPTIONS if o not in defaults] if placeholders and not takes_any else []
        if lacking:
            raise DeclarationError(f"workflow {name!r}: placeholders= (prompt templates) needs the option(s) "
                             f"{', '.join(f'{o}=None' for o in lacking)} in its signature (the run passes its templates "
                             f"and prompt limits as them); its options: {', '.join(defaults) or 'none'}")
        unknown = sorted(set(rules or {}) - set(agents))
        if unknown:
            raise DeclarationError(f"workflow {name!r}: rules.{unknown[0]}: not one of its agents ({', '.join(agents)})")
        WORKFLOWS.register(name, WorkflowSpec(name, fn, agents, fam, needs_retriever, defaults,
                                       {a: _rule_of(r) for a, r in (rules or {}).items()}, effects,
                                       dict(placeholders or {}), prompt_limit, sft, round1_answer, env_step_agent,
                                       title or name, dict(labels or {}), prompts_file, env_step_kinds,
                                       record_figures))
        return fn

    return deco


TEMPLATE_OPTIONS = ("prompts", "protocol")  # what a workflow with prompt templates is passed (protocol.Templates, ProtocolOptions)


def _rule_of(rule: Rule) -> Any:
    """A declared rule as a FormatRule; a registered rule's name not registered yet while the suites
    are still being discovered stays a name, resolved once they all are (`resolve_rule_names`)."""
    if isinstance(rule, str) and rule not in RULES and not discovered():
        return rule
    return as_rule(rule)


def resolve_rule_names() -> None:
    """Every workflow's rules named by a registered name are the rules (run once every suite is in,
    `discovery.CHECKS`); an unknown name is one UserError naming the suite, the file and the field."""
    for name in WORKFLOWS:
        spec = WORKFLOWS.get(name)
        for agent, rule in list(spec.rules.items()):
            if isinstance(rule, str):
                if rule not in RULES:
                    place = where(spec.fn.__module__, inspect.getsourcefile(spec.fn), spec.fn.__code__.co_firstlineno)
                    raise UserError(f"{place}: workflow {name!r}: rules.{agent}: unknown format rule {rule!r}; "
                                    f"known: {', '.join(RULES) or 'none'}")
                spec.rules[agent] = RULES.get(rule)


def signature_defaults(fn: Callable[..., Any]) -> dict[str, Any]:
    """``{option: default}`` of ``fn``'s parameters after the first (the episode); every one must have
    a default (a workflow is called with only the options a user set)."""
    params = list(inspect.signature(fn).parameters.values())[1:]
    missing = [p.name for p in params if p.default is inspect.Parameter.empty
               and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if missing:
        raise DeclarationError(f"workflow {fn.__name__}: option(s) {', '.join(missing)} need a default")
    return {p.name: p.default for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def registered_workflows() -> Registry[WorkflowSpec]:
    """Every registered workflow, the suites discovered first (`drmas_bench.suites.discovery`: a suite
    registers its workflows when it is imported; nothing here imports a suite)."""
    discover()
    return WORKFLOWS


def find_workflow(name: str | None) -> WorkflowSpec | None:
    """The registered workflow ``name``, None when there is none (or no name)."""
    return registered_workflows().find(name)


def get_workflow(name: str) -> WorkflowSpec:
    """The registered workflow ``name``; an unknown name is one UserError listing the known ones."""
    return registered_workflows().get(name)


def workflow_names() -> list[str]:
    """The registered workflows' names, sorted (what a user may pass as ``--workflow`` or ``workflow:``)."""
    return sorted(registered_workflows())


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


def sample_seed(run_seed: int, training_step: int, prompt: str, sample_idx: int, agent: str, turn: int) -> int:
    """The sampling seed of one agent call: a stable 63-bit hash of (run seed, training step (0 outside
    training), prompt id, sample index, agent, turn). Every engine that takes a seed gets it (hf: the
    request's own generator; sglang: ``sampling_seed``; openai: ``seed``)."""
    h = hashlib.sha256("\x1f".join(str(p) for p in ("sample", run_seed, training_step, prompt, sample_idx, agent, turn))
                       .encode())
    return int.from_bytes(h.digest()[:8], "little") & (2**63 - 1)


class Episode:
    """One run of a workflow on one task (one of its n samples); ``training_step`` is the trainer's
    step (0 in eval). Each call is one turn, numbered from 0 in the order the workflow makes them."""

    def __init__(self, task: Task, sample_idx: int, backend: AgentBackend, agents: tuple[str, ...],
                 seed: int = 0, retriever: Any = None, want_logprobs: bool = False, training_step: int = 0):
        self.training_step = training_step
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
        turn_idx = len(self.traj.turns)
        sampling = replace(self._backend.sampling(agent),
                           seed=sample_seed(self._seed, self.training_step, f"{self.task.benchmark}:{self.task.id}",
                                            self.traj.sample_idx, agent, turn_idx))
        limit, side = self._prompt_limit
        req = Request(agent=agent, messages=messages, sampling=sampling, want_logprobs=self._want_logprobs,
                      max_prompt_tokens=limit, truncate=side, sample_idx=self.traj.sample_idx)
        completion = await self._backend.generate(agent, req)
        turn = Turn(agent=agent, wg=self._backend.worker_group(agent), step=turn_idx, request=req, completion=completion)
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
