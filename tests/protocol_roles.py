"""The protocol of REFERENCE.md §2b as one namespace for the tests that check it against the
reference's own outputs: the shared pieces (`drmas_bench.workflows.protocol`) with each suite's
role table (`suites/math/rules.py`: solver, math_verifier; `suites/search/rules.py`:
search_verifier, searcher, answerer), its search environment (`suites/search/env.py`) and the names
the suites give their agents in a team context."""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

from drmas_bench.suites.math import rules as math_rules
from drmas_bench.suites.search import env as search_env
from drmas_bench.suites.search import rules as search_rules
from drmas_bench.workflows import protocol as proto

SUITE_RULES = (math_rules, search_rules)


def _of(role: str):
    return next(m for m in SUITE_RULES if role in m.ROLES)


def valid(role: str, text: str) -> bool:
    return _of(role).valid(role, text)


def project(role: str, text: str) -> str:
    return _of(role).project(role, text)


def reasons(role: str, text: str) -> list[str]:
    return _of(role).reasons(role, text)


P = SimpleNamespace(**{k: getattr(proto, k) for k in dir(proto) if not k.startswith("__")})
P.valid, P.project, P.reasons = valid, project, reasons
P.math_verdict, P.search_verdict = math_rules.math_verdict, search_rules.search_verdict
P.SearchEnv, P.EnvStep, P.observation = search_env.SearchEnv, search_env.EnvStep, search_env.observation
P.team_context = partial(proto.team_context, names={**math_rules.AGENT_NAMES, **search_rules.AGENT_NAMES})
P.env_query, P.last_answer = search_env.env_query, search_env.last_answer
