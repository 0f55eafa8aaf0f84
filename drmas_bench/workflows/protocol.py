"""The interface protocol of REFERENCE.md §2b: what a model sees and must emit, as data plus rules.

Everything a reference-trained checkpoint learned lives here, so the workflows stay short:

- tags and parsing: `tagged(text, tag)` (first opening tag .. first closing tag, stripped),
  `math_verdict`, `search_verdict`, `env_action` (what the environment does with an action);
- validity (the c_inv format penalty): `solver_valid`, `verify_valid`, `action_valid`, `has_cjk`;
- rendering: `observation` (``<information>`` + json.dumps({"result": "Doc 1: ..."}) +
  ``</information>``), `history` (one ``Step t:`` entry per step, empty steps included),
  `team_context` (every earlier output, labelled with its agent);
- chat layout: `chat(templates, role, **values)` -> a fixed system line + the role prompt as the
  user message;
- prompt templates: `Templates`, loaded from the file shipped beside each workflow
  (``<workflow>.prompts.yaml``), replaced by a team file's ``prompts:`` entry or ``--prompts FILE``.

Template files (YAML)::

    workflow: search_route          # optional; checked against the workflow that loads the file
    system: You are a helpful assistant.
    roles:                          # one prompt per agent; placeholders are {{name}}
      verifier: "... {{question}} ... {{history}} ..."
    parts:                          # how context pieces are rendered inside the role prompts
      history_entry: "Step {{step}}:\\n{{action}}\\n{{observation}}"

A file given with ``--prompts`` or ``prompts:`` may hold only some roles / parts; the others keep the
packaged defaults. Placeholders per workflow are listed in `PLACEHOLDERS` (and docs/protocol.md);
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
from typing import Any, Iterable, Literal, Optional

from pydantic import Field

from drmas_bench.schema import Schema, parse
from drmas_bench.types import UserError

# ------------------------------------------------------------------------------ tags and parsing

VERIFY = "verify"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CJK_LO, CJK_HI = "\u4e00", "\u9fff"  # CJK unified ideographs: an action containing one is invalid


def tagged(text: str, tag: str) -> str | None:
    """The text between the first ``<tag>`` and the first ``</tag>``, stripped; None unless both
    occur (a closing tag before the opening one gives "", as the reference's slicing does)."""
    start, end = text.find(f"<{tag}>"), text.find(f"</{tag}>")
    if start < 0 or end < 0:
        return None
    return text[start + len(tag) + 2:end].strip()


def has_cjk(text: str) -> bool:
    return any(CJK_LO <= ch <= CJK_HI for ch in text)


def math_verdict(text: str) -> str:
    """'approve' | 'reject' (REFERENCE §2b): strip the whitespace inside the first <verify> pair,
    then case-sensitive substring tests, approve first; anything else counts as approve."""
    start, end = text.find("<verify>"), text.find("</verify>")
    if 0 <= start < end:
        inner = re.sub(r"\s+", "", text[start + len("<verify>"):end])
        text = text[:start] + f"<verify>{inner}</verify>" + text[end + len("</verify>"):]
    if "<verify>approve</verify>" in text:
        return "approve"
    if "<verify>reject</verify>" in text:
        return "reject"
    return "approve"


def search_verdict(text: str) -> str:
    """'answer' | 'search' (REFERENCE §2b): on the lower-cased whole response, yes -> answer,
    else no -> search, else answer."""
    low = text.lower()
    if "<verify>yes</verify>" in low:
        return "answer"
    if "<verify>no</verify>" in low:
        return "search"
    return "answer"


@dataclass(frozen=True)
class Action:
    """What the search environment does with one step's action: kind 'search' (content = the
    query, possibly empty), 'answer' (content = the answer) or 'empty' (no tag: the episode goes on)."""

    kind: str
    content: str = ""
    text: str = ""  # the action as the history shows it: the tagged action, or "" for an empty step


def env_action(text: str) -> Action:
    """Project a searcher's or answerer's response onto an environment action: a <search> pair
    first, else an <answer> pair, else an empty step."""
    for kind in ("search", "answer"):
        content = tagged(text, kind)
        if content is not None:
            return Action(kind, content, f"<{kind}>{content}</{kind}>")
    return Action("empty")


def solver_valid(text: str) -> bool:
    """A ``\\boxed{`` with a balanced closing brace exists (the reference's extraction succeeds on
    the last one, after the first </think>); ``\\fbox`` and ``\\boxed 5`` do not count; no CJK.
    The extraction is the grading package's strict one, so validity and `reference_compat` agree."""
    from drmas_bench.grading.extract import has_boxed_answer

    return not has_cjk(text) and has_boxed_answer(text)


def verify_valid(text: str) -> bool:
    """Verifiers (math and search): the verify tag pair is present (any content) and no CJK."""
    return tagged(text, VERIFY) is not None and not has_cjk(text)


def action_valid(text: str) -> bool:
    """Searcher / answerer: an action tag pair is present, ``<think>`` and ``</think>`` each occur
    exactly once with ``<think>`` first (where the action sits is not checked), and no CJK."""
    return (env_action(text).kind != "empty" and text.count(THINK_OPEN) == 1 and text.count(THINK_CLOSE) == 1
            and text.find(THINK_OPEN) < text.find(THINK_CLOSE) and not has_cjk(text))


# ------------------------------------------------------------------------------ rendering


def observation(hits: Iterable[Any]) -> str:
    """The retriever's top-k as the model sees them: ``<information>`` + the JSON string of
    ``{"result": "Doc 1: \\"Title\\"\\ntext\\nDoc 2: ..."}`` + ``</information>``."""
    docs = "\n".join(f'Doc {i}: "{h.title}"\n{h.text}' for i, h in enumerate(hits, 1))
    return "<information>" + json.dumps({"result": docs}) + "</information>"


@dataclass
class Step:
    """One env step of the search workflow, for the history (empty steps included)."""

    step: int
    action: str  # the tagged action ("" for an empty step)
    observation: str  # "" unless the action was a search
    response: str  # the acting agent's whole response


def history(tpl: "Templates", steps: list[Step]) -> str:
    if not steps:
        return tpl.parts["history_empty"]
    return tpl.parts["history_sep"].join(
        render(tpl.parts["history_entry"], step=s.step, action=s.action, observation=s.observation, response=s.response)
        for s in steps)


def team_context(tpl: "Templates", outputs: list[tuple[str, str]]) -> str:
    """Every earlier output of the episode, oldest first, each labelled with its agent."""
    if not outputs:
        return tpl.parts["context_empty"]
    return tpl.parts["context_sep"].join(
        render(tpl.parts["context_entry"], agent=agent, Agent=agent.capitalize(), turn=i, text=text.strip())
        for i, (agent, text) in enumerate(outputs, 1))


# ------------------------------------------------------------------------------ templates

_PH = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")

# placeholders each role prompt may use, and those it must use, per workflow
PLACEHOLDERS: dict[str, dict[str, tuple[set[str], set[str]]]] = {
    "math_refine": {
        "solver": ({"question", "team_context", "round", "rounds"}, {"question", "team_context"}),
        "verifier": ({"question", "team_context", "round", "rounds"}, {"question", "team_context"}),
    },
    "search_route": {
        "verifier": ({"question", "history", "step", "max_steps"}, {"question", "history"}),
        "searcher": ({"question", "history", "step", "max_steps", "verifier_output"},
                     {"question", "history", "verifier_output"}),
        "answerer": ({"question", "history", "step", "max_steps"}, {"question", "history"}),
    },
}
# rendering parts (same for every workflow) and their placeholders
PARTS: dict[str, set[str]] = {
    "context_entry": {"agent", "Agent", "turn", "text"},
    "context_sep": set(),
    "context_empty": set(),
    "history_entry": {"step", "action", "observation", "response"},
    "history_sep": set(),
    "history_empty": set(),
}


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


def packaged_path(workflow: str) -> Path:
    return Path(__file__).with_name(f"{workflow}.prompts.yaml")


@lru_cache(maxsize=None)
def _packaged(workflow: str) -> Templates:
    import yaml

    p = packaged_path(workflow)
    if workflow not in PLACEHOLDERS or not p.is_file():
        raise UserError(f"workflow {workflow!r} has no prompt templates")
    d = yaml.safe_load(p.read_text(encoding="utf-8"))
    return _merge(Templates(workflow, "", {}, {}), d, where=p.name, source="packaged", complete=True)


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
    spec = PLACEHOLDERS[wf]
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
        lacking = [r for r in spec if r not in roles] + [p for p in PARTS if p not in parts]
        if lacking:
            raise UserError(f"{where}: no template for {lacking[0]!r}")
    return Templates(wf, system, roles, parts, source)


def load_templates(workflow: str, *overrides: tuple[Any, str]) -> Templates:
    """The packaged templates of `workflow` with each override applied in order. An override is
    (mapping or path of a YAML file, where it came from); None entries are skipped."""
    from drmas_bench.yamlfile import read_yaml

    tpl = default_templates(workflow)
    for value, where in overrides:
        if value is None:
            continue
        if isinstance(value, (str, Path)):
            value, where = read_yaml(value, "prompts file"), str(value)
        tpl = _merge(tpl, value, where=where, source=where)
    return tpl


def has_templates(workflow: str) -> bool:
    return workflow in PLACEHOLDERS


# ------------------------------------------------------------------------------ chat layout

# REFERENCE §2b / §3: prompt-length limit and the side cut when a prompt is longer, per workflow
PROMPT_LIMITS: dict[str, tuple[int, str]] = {"math_refine": (8192, "middle"), "search_route": (4096, "left")}
TRUNCATE_SIDES = ("left", "middle", "right")


def chat(tpl: Templates, role: str, **values: Any) -> list[dict[str, str]]:
    """Two messages (REFERENCE §2b): the fixed system line, and the whole role prompt as the user
    message."""
    return [{"role": "system", "content": tpl.system}, {"role": "user", "content": render(tpl.roles[role], **values)}]


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
        limit, side = PROMPT_LIMITS.get(workflow, (0, "left"))
        m = limit if self.max_prompt_tokens is None else self.max_prompt_tokens
        return (m or None), (self.truncate or side)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in (("max_prompt_tokens", self.max_prompt_tokens), ("truncate", self.truncate))
                if v is not None}


# ------------------------------------------------------------------------------ retriever record


def retriever_record(spec: str | None) -> dict[str, Any] | None:
    """What a checkpoint records of the retriever it was trained with: ``{kind, identity}``.
    identity: for an index folder a hash of its manifest's kind, size, parameters and corpus size
    (not its path, so a copy on another machine matches); for a server its URL."""
    if not spec:
        return None
    from drmas_retrieval.loader import parse_spec
    from drmas_retrieval.store import read_manifest

    kind, where = parse_spec(spec)
    if kind == "http":
        return {"kind": kind, "identity": where.rstrip("/")}
    m = read_manifest(where)
    key = {"kind": m.get("kind"), "n_passages": m.get("n_passages"), "params": m.get("params"),
           "corpus_bytes": (m.get("corpus") or {}).get("bytes"), "encoder": m.get("encoder")}
    return {"kind": kind, "identity": hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]}
