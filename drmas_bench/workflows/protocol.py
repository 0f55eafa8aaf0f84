"""The interface protocol of REFERENCE.md §2b that every suite shares: the tag grammar, the chat
layout, the rendering of a team context and an env history, and the prompt templates.

What a role must emit and what is read off it is its suite's (the role table: ``suites/math/rules.py``
for the solver and math_verifier, ``suites/search/rules.py`` for the search_verifier, searcher and
answerer; the search environment: ``suites/search/env.py``); the pieces two suites use live here:

- tags: `verify_splice` (a verifier's projected text), `verify_reasons` (a verifier's validity),
  `tag_action` (an actor's projected action), `think_reasons`, `has_cjk`;
- rendering: `history` (``Step {n}:{A} {O}\\n`` entries, last 4 steps), `team_context`
  (``\\nThe output of "{Agent Name}": {projected}\\n`` entries, each agent under the name its suite
  gives it);
- chat layout: `chat(templates, role, **values)` -> the system line + the role prompt as the user
  message;
- prompt templates: `Templates`, loaded from the file shipped beside each workflow
  (``<workflow>.prompts.yaml``), replaced by a team file's ``prompts:`` entry or ``--prompts FILE``.

Template files (YAML)::

    workflow: search_route          # optional; checked against the workflow that loads the file
    system: You are a helpful and harmless assistant.
    roles:                          # one prompt per agent; placeholders are {{name}}
      verifier: "... {{question}} ... {{history}} ..."
    parts:                          # how context pieces are rendered inside the role prompts
      history_entry: "Step {{step}}:{{action}} {{observation}}\\n"

A file given with ``--prompts`` or ``prompts:`` may hold only some roles / parts; the others keep the
packaged defaults. Placeholders per workflow are declared by the workflow (`WorkflowSpec.placeholders`,
`placeholders(workflow)`; docs/protocol.md);
an unknown one, or a required one a role lacks, is a one-line UserError naming file, role and
placeholder. Literal braces (``\\boxed{}``) need no escaping: only ``{{name}}`` is substituted.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, Mapping, Optional, Protocol, Sequence

import yaml
from pydantic import Field

from drmas_bench.engines.prompt import TRUNCATE_SIDES
from drmas_bench.schema import Schema, parse
from drmas_bench.suites import discovery
from drmas_bench.types import UserError
from drmas_bench.workflows.base import find_workflow, registered_workflows
from drmas_bench.yamlfile import read_yaml

# ------------------------------------------------------------------------------ tags

VERIFY_OPEN, VERIFY_CLOSE = "<verify>", "</verify>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CJK_LO, CJK_HI = "\u4e00", "\u9fff"  # CJK unified ideographs: a verifier / action response with one is invalid
# one regex scan instead of a Python loop over every character: the viewer and the summary test every
# verifier and action response of a run (190,844 calls for a 20,000-trajectory search run)
_CJK = re.compile(f"[{CJK_LO}-{CJK_HI}]")


def has_cjk(text: str) -> bool:
    """Any character in U+4E00..U+9FFF (kana, Hangul, extension A are outside the range)."""
    return _CJK.search(text) is not None


def verify_splice(text: str) -> str:
    """A verifier's projected text: the whole response with the content of the first verify pair
    stripped at both ends (the opening and closing tags are found independently).

    No `<verify>` or no `</verify>`: unchanged. A `</verify>` before the first `<verify>` gives an
    empty content and repeats the text between the two (``</verify>no<verify>`` ->
    ``</verify>no<verify></verify>no<verify>``), as the reference's slicing does; later pairs stay."""
    start, end = text.find(VERIFY_OPEN), text.find(VERIFY_CLOSE)
    if start < 0 or end < 0:
        return text
    head = start + len(VERIFY_OPEN)
    return text[:head] + text[head:end].strip() + text[end:]


def verify_reasons(text: str) -> list[str]:
    """Every reason a verifier's response (math or search) fails its validity rule:
    missing_verify_tag (``<verify>`` or ``</verify>`` absent), cjk (`has_cjk`)."""
    out = [] if VERIFY_OPEN in text and VERIFY_CLOSE in text else ["missing_verify_tag"]
    return out + (["cjk"] if has_cjk(text) else [])


def tag_action(text: str, tag: str) -> str:
    """A searcher's / answerer's projected action: ``<tag>`` + the stripped text between the first
    ``<tag>`` and the first ``</tag>`` + ``</tag>``; "" unless both occur (other tags inside stay; a
    closing tag first gives the empty pair ``<tag></tag>``). Case-sensitive: ``<SEARCH>`` is no tag."""
    op, cl = f"<{tag}>", f"</{tag}>"
    start, end = text.find(op), text.find(cl)
    if start < 0 or end < 0:
        return ""
    return op + text[start + len(op):end].strip() + cl


def think_reasons(text: str) -> list[str]:
    """think_count (``<think>`` or ``</think>`` not exactly once) or think_order (each once, the
    closing tag first): the think-block part of an actor's rule."""
    if text.count(THINK_OPEN) != 1 or text.count(THINK_CLOSE) != 1:
        return ["think_count"]
    return ["think_order"] if text.find(THINK_OPEN) > text.find(THINK_CLOSE) else []


# ------------------------------------------------------------------------------ rendering

HISTORY_WINDOW = 4  # the history shows the last 4 steps (with 4-step episodes: all earlier ones)


class Step(Protocol):
    """An env step as the history shows it (the search env's `EnvStep` is one)."""

    step: int
    action: str
    observation: str
    response: str


def history(tpl: "Templates", steps: Sequence[Step], window: int = HISTORY_WINDOW) -> str:
    """The history text of the env prompt: one ``history_entry`` per stored step of the last
    `window` (absolute step numbers), joined by ``history_sep``; ``history_empty`` at step 1."""
    if not steps:
        return tpl.parts["history_empty"]
    return tpl.parts["history_sep"].join(
        render(tpl.parts["history_entry"], step=s.step, action=s.action, observation=s.observation,
               response=s.response)
        for s in steps[-window:])


def team_context(tpl: "Templates", outputs: list[tuple[str, str]], names: Mapping[str, str] | None = None) -> str:
    """The team context: one ``context_entry`` per (agent, projected text), in call order, joined
    by ``context_sep``; ``context_empty`` when nobody spoke yet. ``names``: {agent: the name the
    entry gives it} (``{{agent_name}}``; the suite's ``Suite.agent_names``), an agent not in it by its own."""
    if not outputs:
        return tpl.parts["context_empty"]
    names = names or {}
    return tpl.parts["context_sep"].join(
        render(tpl.parts["context_entry"], agent=agent, Agent=agent.capitalize(),
               agent_name=names.get(agent, agent), turn=i, text=text)
        for i, (agent, text) in enumerate(outputs, 1))


# ------------------------------------------------------------------------------ templates

_PH = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")

# the placeholders each role prompt may use and must use are declared by each workflow
# (`WorkflowSpec.placeholders`, read by `placeholders`)
# rendering parts (same for every workflow) and their placeholders
PARTS: dict[str, set[str]] = {
    "context_entry": {"agent", "Agent", "agent_name", "turn", "text"},
    "context_sep": set(),
    "context_empty": set(),
    "history_entry": {"step", "action", "observation", "response"},
    "history_sep": set(),
    "history_empty": set(),
}


# which rendering parts a role prompt's placeholder needs: a workflow whose roles may use
# {{team_context}} renders the context parts, {{history}} the history parts; the others it never reads
PARTS_OF = {"team_context": ("context_entry", "context_sep", "context_empty"),
            "history": ("history_entry", "history_sep", "history_empty")}


def needed_parts(workflow: str) -> list[str]:
    """The rendering parts `workflow` uses (`PARTS_OF` the placeholders its role prompts may use):
    a packaged prompts file must hold these; the others are optional."""
    allowed = set().union(*(a for a, _ in placeholders(workflow).values())) if placeholders(workflow) else set()
    return [part for ph, parts in PARTS_OF.items() if ph in allowed for part in parts]


def render(template: str, **values: Any) -> str:
    """Substitute ``{{name}}`` placeholders (names already validated at load time)."""
    return _PH.sub(lambda m: str(values[m.group(1)]), template)


@dataclass(frozen=True)
class Templates:
    """The resolved prompts of one workflow: a system line, one prompt per role, rendering parts."""

    workflow: str
    system: str
    roles: dict[str, str]
    parts: dict[str, str]
    source: str = "packaged"  # where the prompts came from (packaged | a file | a team file)

    def to_dict(self) -> dict[str, Any]:
        """The mapping a prompts file / team.yaml holds (loads back to the same templates)."""
        return {"workflow": self.workflow, "system": self.system, "roles": dict(self.roles), "parts": dict(self.parts)}

    @property
    def sha256(self) -> str:
        """Hash of the resolved templates (enters the run identity and summary.json)."""
        canon = json.dumps({"system": self.system, "roles": self.roles, "parts": self.parts}, sort_keys=True)
        return hashlib.sha256(canon.encode()).hexdigest()


def packaged_path(workflow: str) -> Path | None:
    """The workflow's packaged prompts file (beside its module: `WorkflowSpec.prompts_file`)."""
    spec = find_workflow(workflow)
    return spec.prompts_file if spec is not None else None


def placeholders(workflow: str) -> dict[str, tuple[set[str], set[str]]]:
    """{role: (allowed, required) placeholders} that `workflow` declares; {} for one without templates."""
    spec = find_workflow(workflow)
    return spec.placeholders if spec is not None else {}


@lru_cache(maxsize=None)
def _packaged(workflow: str) -> Templates:

    p = packaged_path(workflow)
    if not placeholders(workflow) or p is None:
        raise UserError(f"workflow {workflow!r} has no prompt templates")
    if not p.is_file():
        raise UserError(f"{p.name}: missing: workflow {workflow!r} declares placeholders= (prompt templates), "
                        f"which it ships beside its module as {p.name}")
    try:
        d = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise UserError(f"{p.name}: not YAML ({str(e).splitlines()[0]})") from None
    return _merge(Templates(workflow, "", {}, {}), d, where=p.name, source="packaged", complete=True)


def check_packaged_prompts() -> None:
    """Every registered workflow that declares prompt templates ships its prompts file, with a
    template for each of its roles and each rendering part it uses (run once every suite is in,
    `discovery.CHECKS`); else one UserError naming the suite, the file and the field."""
    for name in registered_workflows():
        spec = find_workflow(name)
        if spec is None or not spec.placeholders:
            continue
        try:
            _packaged(name)
        except UserError as e:
            what = str(e).removeprefix(f"{spec.prompts_file.name}: ") if spec.prompts_file else str(e)
            raise UserError(f"{discovery.where(spec.fn.__module__, spec.prompts_file)}: {what}") from None


def default_templates(workflow: str) -> Templates:
    """The templates shipped with the package for `workflow`."""
    return _packaged(workflow)


def _check(template: str, allowed: set[str], required: set[str], where: str, what: str) -> str:
    used = set(_PH.findall(template))
    unknown = sorted(used - allowed)
    if unknown:
        raise UserError(f"{where}: {what}: unknown placeholder {{{{{unknown[0]}}}}}; "
                        f"allowed: {', '.join(sorted(allowed)) or 'none'}")
    missing = sorted(required - used)
    if missing:
        raise UserError(f"{where}: {what}: missing placeholder {{{{{missing[0]}}}}}")
    return template


class PromptsFileSchema(Schema):
    """A prompts file (``--prompts FILE``, a team file's ``prompts:``); every key optional."""

    workflow: Optional[str] = Field(None, description="the workflow the prompts are for (checked against the run's)")
    system: Optional[str] = Field(None, description="the fixed system line of every call")
    roles: Optional[dict[str, str]] = Field(
        None, description="agent -> its prompt; placeholders {{name}} (per workflow: docs/protocol.md)")
    parts: Optional[dict[str, str]] = Field(
        None, description="how context pieces are rendered inside the role prompts (history_entry, ...)")


def _merge(base: Templates, d: Any, *, where: str, source: str, complete: bool = False) -> Templates:
    """`base` with the system line / roles / parts that mapping `d` replaces, validated."""
    wf = base.workflow
    if not isinstance(d, dict):
        raise UserError(f"{where}: a prompts file must be a mapping with `roles:` (and optionally `system:`, `parts:`)")
    f = parse(PromptsFileSchema, d, where)
    if f.workflow not in (None, wf):
        raise UserError(f"{where}: workflow: prompts are for workflow {f.workflow!r}, this run uses {wf!r}")
    roles, parts = dict(base.roles), dict(base.parts)
    spec = placeholders(wf)
    for role, text in (f.roles or {}).items():
        if role not in spec:
            raise UserError(f"{where}: roles.{role}: unknown role {role!r} for workflow {wf}; roles: {', '.join(spec)}")
        roles[role] = _check(text, *spec[role], where, f"roles.{role}")
    for part, text in (f.parts or {}).items():
        if part not in PARTS:
            raise UserError(f"{where}: parts.{part}: unknown part {part!r}; parts: {', '.join(PARTS)}")
        parts[part] = _check(text, PARTS[part], set(), where, f"parts.{part}")
    system = base.system if f.system is None else f.system
    if complete:
        lacking = [f"roles.{r}" for r in spec if r not in roles] + [f"parts.{p}" for p in needed_parts(wf) if p not in parts]
        if lacking:
            raise UserError(f"{where}: {lacking[0]}: no template (workflow {wf} uses it)")
    return Templates(wf, system, roles, parts, source)


def load_templates(workflow: str, *overrides: tuple[Any, str]) -> Templates:
    """The packaged templates of `workflow` with each override applied in order. An override is
    (mapping or path of a YAML file, where it came from); None entries are skipped."""

    tpl = default_templates(workflow)
    for value, where in overrides:
        if value is None:
            continue
        if isinstance(value, (str, Path)):
            value, where = read_yaml(value, "prompts file"), str(value)
        tpl = _merge(tpl, value, where=where, source=where)
    return tpl


def has_templates(workflow: str) -> bool:
    return bool(placeholders(workflow))


# ------------------------------------------------------------------------------ chat layout

def chat(tpl: Templates, role: str, **values: Any) -> list[dict[str, str]]:
    """The messages of one call: `chat_messages` of the templates' system line and the rendered
    role prompt."""
    return chat_messages(tpl.system, render(tpl.roles[role], **values))


def chat_messages(system: str, user: str) -> list[dict[str, str]]:
    """REFERENCE §2b chat layout: two messages, the system line and the agent's whole prompt as the
    user message (packaged system line: ``You are a helpful and harmless assistant.``, both suites)."""
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


class ProtocolSchema(Schema):
    """A team file's ``protocol:`` entry (also recorded in a trained checkpoint's team.yaml)."""

    max_prompt_tokens: Optional[int] = Field(
        None, ge=0, description="limit on the chat-templated prompt tokens (null = the workflow's reference limit; 0 = none)")
    truncate: Optional[Literal[TRUNCATE_SIDES]] = Field(
        None, description="which tokens go when a prompt is longer: left | middle | right (null = the workflow's side)")


@dataclass
class ProtocolOptions:
    """Per-run protocol options (team file ``protocol:`` entry, ``--max-prompt-tokens``).

    max_prompt_tokens  limit on the chat-templated prompt (None = the workflow's reference limit;
                       0 = no limit)
    truncate           which tokens go when a prompt is longer: left | middle | right
                       (None = the workflow's reference side)
    """

    max_prompt_tokens: int | None = None
    truncate: str | None = None

    @classmethod
    def from_dict(cls, d: Any, where: str) -> "ProtocolOptions":
        """Options from a team file's ``protocol:`` mapping (:class:`ProtocolSchema`); None = defaults."""
        p = parse(ProtocolSchema, d or {}, where, prefix="protocol")
        return cls(p.max_prompt_tokens, p.truncate)

    def resolve(self, workflow: str) -> tuple[int | None, str]:
        """(max_prompt_tokens or None for no limit, truncation side) for `workflow`."""
        spec = find_workflow(workflow)  # the workflow's reference limit (`WorkflowSpec.prompt_limit`)
        limit, side = spec.prompt_limit if spec is not None else (0, "left")
        m = limit if self.max_prompt_tokens is None else self.max_prompt_tokens
        return (m or None), (self.truncate or side)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in (("max_prompt_tokens", self.max_prompt_tokens), ("truncate", self.truncate))
                if v is not None}


# ------------------------------------------------------------------------------ retriever record


