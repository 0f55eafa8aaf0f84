"""The search suite's environment (REFERENCE.md §2b "Search control flow"): `SearchEnv` (done test,
reward = EM of the last answer match in the episode's text, query extraction), its steps
(`EnvStep`), and `observation` (``<information>`` + JSON + ``</information>``), the retriever's
top-k as the env hands them on. Checked against the reference's own outputs
(tests/test_reference_vectors.py)."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from drmas_bench.grading.qa import grade_qa

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
