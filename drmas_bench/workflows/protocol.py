"""The interface protocol of REFERENCE.md §2b: what a model sees and must emit, as data plus rules.

Everything a reference-trained checkpoint learned lives here, so the workflows stay short. Each rule
is checked against the reference's own outputs (tests/test_reference_vectors.py; the rule table is
docs/protocol.md):

- projection (what a response becomes: the team-context text and, for the searcher and answerer, the
  env action): `project(role, text)`, built on `verify_splice` and `tag_action`;
- validity (the c_inv format penalty): `reasons(role, text)` (every reason a response fails; each
  role is registered as a format rule of that name), `valid(role, text)`, `has_cjk`;
- verdicts: `math_verdict`, `search_verdict` (on the spliced response);
- the search environment: `SearchEnv` (done test, reward = EM of the last answer match in the
  episode's text, query extraction), `observation` (``<information>`` + JSON + ``</information>``);
- rendering: `history` (``Step {n}:{A} {O}\\n`` entries, last 4 steps), `team_context`
  (``\\nThe output of "{Agent Name}": {projected}\\n`` entries);
- chat layout: `chat(templates, role, **values)` -> the system line + the role prompt as the user
  message;
- prompt templates: `Templates`, loaded from the file shipped beside each workflow
  (``<workflow>.prompts.yaml``), replaced by a team file's ``prompts:`` entry or ``--prompts FILE``.

The five protocol roles (solver, math_verifier, search_verifier, searcher, answerer) are text
functions here; each suite turns the roles its workflows use into format rules
(``workflows.rules.FormatRule``: ``suites/math/rules.py``, ``suites/search/rules.py``), and the
workflows' agents map onto them (the verifier agent is ``math_verifier`` in math_refine and
``search_verifier`` in search_route).

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
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Literal, Optional

import yaml
from pydantic import Field

from drmas_bench.engines.prompt import TRUNCATE_SIDES
from drmas_bench.grading.extract import has_boxed_answer
from drmas_bench.grading.qa import grade_qa
from drmas_bench.schema import Schema, parse
from drmas_bench.types import UserError
from drmas_bench.workflows.base import find_workflow
from drmas_bench.yamlfile import read_yaml

# ------------------------------------------------------------------------------ roles and tags

# the names the reference writes in the team context, per agent of our workflows
AGENT_NAMES = {"solver": "Solver Agent", "verifier": "Verifier Agent", "searcher": "Search Agent",
               "answerer": "Answer Agent"}
ACTION_TAGS = {"searcher": "search", "answerer": "answer"}  # each looks for its own tag only
VERIFIERS = ("math_verifier", "search_verifier")  # the roles whose reply is a <verify> verdict
VERIFY_OPEN, VERIFY_CLOSE = "<verify>", "</verify>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CJK_LO, CJK_HI = "\u4e00", "\u9fff"  # CJK unified ideographs: a verifier / action response with one is invalid


def has_cjk(text: str) -> bool:
    """Any character in U+4E00..U+9FFF (kana, Hangul, extension A are outside the range)."""
    return any(CJK_LO <= ch <= CJK_HI for ch in text)


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


def tag_action(text: str, tag: str) -> str:
    """A searcher's / answerer's projected action: ``<tag>`` + the stripped text between the first
    ``<tag>`` and the first ``</tag>`` + ``</tag>``; "" unless both occur (other tags inside stay; a
    closing tag first gives the empty pair ``<tag></tag>``). Case-sensitive: ``<SEARCH>`` is no tag."""
    op, cl = f"<{tag}>", f"</{tag}>"
    start, end = text.find(op), text.find(cl)
    if start < 0 or end < 0:
        return ""
    return op + text[start + len(op):end].strip() + cl


def project(role: str, text: str) -> str:
    """What the reference keeps of `role`'s response (team context; the env action for the
    searcher and answerer): solver unchanged, verifiers spliced, searcher / answerer tag actions."""
    if role == "solver":
        return text
    if role in VERIFIERS:
        return verify_splice(text)
    if role in ACTION_TAGS:
        return tag_action(text, ACTION_TAGS[role])
    raise ValueError(f"unknown protocol role {role!r}; roles: solver, {', '.join(VERIFIERS + tuple(ACTION_TAGS))}")


def reasons(role: str, text: str) -> list[str]:
    """Every reason `role`'s response fails its validity rule, the row's is_action_valid (REFERENCE
    §2b "Validity"; invalid costs the row c_inv); empty: valid. One implementation: `valid` is its
    negation and compliance counts these reasons.

    - solver: the reference's boxed extraction on the whole response returns a string (no CJK
      rule); missing_boxed (no ``\\boxed`` at all), unbalanced_boxed (there is one, but the
      extraction finds no answer: the last one is not ``\\boxed{`` with its closing brace);
    - verifiers: missing_verify_tag (``<verify>`` or ``</verify>`` absent), cjk;
    - searcher / answerer: missing_action_tag (its own pair, ``<search>`` / ``<answer>``, absent),
      think_count (``<think>`` or ``</think>`` not exactly once), think_order (each once, closing
      first), cjk (where the action sits is not checked).

    cjk = a character in U+4E00..U+9FFF (`has_cjk`)."""
    out: list[str] = []
    if role == "solver":
        if not has_boxed_answer(text):
            out.append("missing_boxed" if "\\boxed" not in text else "unbalanced_boxed")
        return out
    if role in VERIFIERS:
        if VERIFY_OPEN not in text or VERIFY_CLOSE not in text:
            out.append("missing_verify_tag")
    elif role in ACTION_TAGS:
        tag = ACTION_TAGS[role]
        if f"<{tag}>" not in text or f"</{tag}>" not in text:
            out.append("missing_action_tag")
        out += think_reasons(text)
    else:
        raise ValueError(f"unknown protocol role {role!r}; roles: solver, {', '.join(VERIFIERS + tuple(ACTION_TAGS))}")
    if has_cjk(text):
        out.append("cjk")
    return out


def think_reasons(text: str) -> list[str]:
    """think_count (``<think>`` or ``</think>`` not exactly once) or think_order (each once, the
    closing tag first): the think-block part of the searcher's and answerer's rule."""
    if text.count(THINK_OPEN) != 1 or text.count(THINK_CLOSE) != 1:
        return ["think_count"]
    return ["think_order"] if text.find(THINK_OPEN) > text.find(THINK_CLOSE) else []


def valid(role: str, text: str) -> bool:
    """Whether `role`'s response passes its validity rule: `reasons` finds none."""
    return not reasons(role, text)


def math_verdict(text: str) -> str:
    """'approve' | 'reject' of a math verifier's raw response: case-sensitive substring tests on the
    spliced response, approve first; neither counts as approve (``<verify>re ject</verify>`` and a
    later ``<verify> reject </verify>`` approve: only the first pair's ends are stripped)."""
    spliced = verify_splice(text)
    if "<verify>approve</verify>" in spliced:
        return "approve"
    if "<verify>reject</verify>" in spliced:
        return "reject"
    return "approve"


def search_verdict(text: str) -> str:
    """'answer' | 'search' of a search verifier's raw response: the spliced response lower-cased,
    then yes -> answer, else no -> search, else answer (the splice is case-sensitive, the test is
    not: ``<VERIFY>no</VERIFY>`` searches, ``<VERIFY> no </VERIFY>`` answers)."""
    low = verify_splice(text).lower()
    if "<verify>yes</verify>" in low:
        return "answer"
    if "<verify>no</verify>" in low:
        return "search"
    return "answer"


# ------------------------------------------------------------------------------ the search environment

_SEARCH_RE = re.compile(r"<search>(.*?)</search>", re.DOTALL)
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
NO_RESULTS = "No search results found."


def observation(hits: Iterable[Any] | None) -> str:
    """The retriever's top-k for one query as the env hands them on: ``<information>`` + the JSON of
    ``{"result": R}`` + ``</information>``, R = ``Doc {i}: `` + strip(contents) + ``\\n`` per
    document (the last one too); contents is the server's ``"Title"\\ntext`` (`Hit.contents`).

    JSON in Python's default layout (non-ASCII as ``\\uXXXX``; ``<``, ``>``, ``/`` unescaped). No
    documents for the query gives ``{"result": ""}``; ``None`` (the server returned no result list
    at all) gives ``{"result": "No search results found."}``."""
    if hits is None:
        result = NO_RESULTS
    else:
        result = "".join(f"Doc {i}: {_contents(h).strip()}\n" for i, h in enumerate(hits, 1))
    return "<information>" + json.dumps({"result": result}) + "</information>"


def observation_passages(obs: str) -> str:
    """The passages' own text in an `observation` (the JSON's ``result``, newlines and quotes
    unescaped), for reading what was retrieved (`suites.search.search_route.search_effects`); a text not in that
    layout (hand-made records) is returned as it is."""
    inner = obs.strip()
    if inner.startswith("<information>") and inner.endswith("</information>"):
        try:
            doc = json.loads(inner[len("<information>"):-len("</information>")])
        except ValueError:
            return obs
        if isinstance(doc, dict) and isinstance(doc.get("result"), str):
            return doc["result"]
    return obs


def _contents(hit: Any) -> str:
    if isinstance(hit, dict):
        return hit["contents"] if "contents" in hit else f'"{hit["title"]}"\n{hit["text"]}'
    return hit.contents


def env_query(action: str) -> str | None:
    """The query of an env action: the text of the first shortest ``<search>``..``</search>``
    match (newlines allowed), unstripped; None unless both tags occur."""
    if "<search>" not in action or "</search>" not in action:
        return None
    m = _SEARCH_RE.search(action)
    return m.group(1) if m else None


def last_answer(text: str) -> str | None:
    """The stripped content of the last shortest ``<answer>``..``</answer>`` match in `text`, or None."""
    found = _ANSWER_RE.findall(text)
    return found[-1].strip() if found else None


@dataclass
class EnvStep:
    """One step of the search env: the action it took and what it made of it."""

    step: int  # 1-based; empty steps count
    action: str  # the projected action ("" for an empty step)
    done: bool = False
    reward: float = 0.0
    query: str | None = None  # as extracted, before the tool strips it; None when done or none
    observation: str = ""  # "" for an empty step and at done
    response: str = ""  # the acting agent's whole response ("" when nobody acted)


@dataclass
class SearchEnv:
    """The reference's search env for one episode (REFERENCE §2b "Search control flow", step 4).

    `act(action)` counts the turn, stores the action and decides: done when the turn reaches
    `max_steps` or the action holds both ``<answer>`` and ``</answer>`` (two substring tests); at
    done the reward is the EM against `golds` of the last answer match in the concatenation of every
    action and stored observation so far; otherwise the step's query (if any) is for the caller to
    retrieve, and `observe` stores the observation (the env keeps it as ``\\n`` + obs + ``\\n``)."""

    golds: list[str]
    max_steps: int = 4
    steps: list[EnvStep] = field(default_factory=list)
    _text: list[str] = field(default_factory=list, init=False, repr=False)  # what the env concatenates

    def act(self, action: str, response: str = "") -> EnvStep:

        st = EnvStep(len(self.steps) + 1, action, response=response)
        self.steps.append(st)
        self._text.append(action)
        st.done = st.step >= self.max_steps or ("<answer>" in action and "</answer>" in action)
        if st.done:
            answer = last_answer("".join(self._text))
            st.reward = grade_qa(answer, self.golds).em if answer is not None else 0.0
        else:
            st.query = env_query(action)
        return st

    def observe(self, observation: str) -> None:
        """The observation of the last step (the env stores it wrapped in newlines)."""
        self.steps[-1].observation = observation
        if observation:
            self._text.append("\n" + observation + "\n")

    @property
    def done(self) -> bool:
        return bool(self.steps) and self.steps[-1].done

    @property
    def answer(self) -> str | None:
        """What the env graded at done: the last answer match of the episode's text (None if none)."""
        return last_answer("".join(self._text)) if self.done else None

    @property
    def reward(self) -> float:
        return sum(s.reward for s in self.steps)

    def record(self) -> dict[str, Any]:
        """The env's account of the episode (kept in the trajectory's ``extra["env"]``)."""
        steps = [{k: v for k, v in asdict(s).items() if k != "response"} for s in self.steps]
        return {"steps": steps, "answer": self.answer, "reward": self.reward,
                "length": len(self.steps), "won": self.done and self.reward >= 1}


# ------------------------------------------------------------------------------ rendering

HISTORY_WINDOW = 4  # the history shows the last 4 steps (with 4-step episodes: all earlier ones)


def history(tpl: "Templates", steps: list[EnvStep], window: int = HISTORY_WINDOW) -> str:
    """The history text of the env prompt: one ``history_entry`` per stored step of the last
    `window` (absolute step numbers), joined by ``history_sep``; ``history_empty`` at step 1."""
    if not steps:
        return tpl.parts["history_empty"]
    return tpl.parts["history_sep"].join(
        render(tpl.parts["history_entry"], step=s.step, action=s.action, observation=s.observation,
               response=s.response)
        for s in steps[-window:])


def team_context(tpl: "Templates", outputs: list[tuple[str, str]]) -> str:
    """The team context: one ``context_entry`` per (agent, projected text), in call order, joined
    by ``context_sep``; ``context_empty`` when nobody spoke yet."""
    if not outputs:
        return tpl.parts["context_empty"]
    return tpl.parts["context_sep"].join(
        render(tpl.parts["context_entry"], agent=agent, Agent=agent.capitalize(),
               agent_name=AGENT_NAMES.get(agent, agent), turn=i, text=text)
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
    if not placeholders(workflow) or p is None or not p.is_file():
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
        lacking = [r for r in spec if r not in roles] + [p for p in PARTS if p not in parts]
        if lacking:
            raise UserError(f"{where}: no template for {lacking[0]!r}")
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


