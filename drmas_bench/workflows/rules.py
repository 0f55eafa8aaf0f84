"""Format rules: what an agent's reply must look like, and everything read off a reply by that rule.

A :class:`FormatRule` is the one home of a reply format's knowledge: the workflow records
``turn.valid = not rule.reasons(text)``; compliance counts the same reasons and asks the rule for its
per-agent figures (actions, verdicts) and its per-episode figures; the viewer shows ``rule.parse(text)``
(the action the reply took, the verdict it gave). Nothing outside the rule's own module compares a
rule's name. A rule is declared once, in the module of the suite or workflow that owns the format,
with :func:`format_rule`; workflows name their agents' rules by object (``rules={"solver": ANSWER}``)
or by a registered name.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol

from drmas_bench.figures import Figure
from drmas_bench.records import RecordView
from drmas_bench.registry import DeclarationError, Registry
from drmas_bench.suites.discovery import discover

Parsed = tuple[str | None, str | None]  # (the action a reply took, the verdict it gave); None: it has none


def parse_nothing(text: str) -> Parsed:
    """The parse of a rule that reads no action and no verdict off a reply."""
    return None, None


@dataclass(frozen=True)
class FormatRule:
    """A reply format and what it reads off a reply.

    name: how compliance and the viewer name it (``summary.json``'s ``rule``);
    reasons: ``text -> [reason, ...]``, every reason the reply fails (empty: valid);
    reason_names: the reasons it can give, in the order a summary lists them (others follow, sorted);
    parse: ``text -> (action, verdict)`` shown beside each reply in the viewer;
    agent_figures: ``[reply text, ...] -> {figure: value}``, the per-agent compliance figures over
        one agent's replies (e.g. ``actions``, ``verdicts``), None: none;
    episode_figures: ``[RecordView, ...] -> {figure: value}``, the per-episode compliance figures
        (e.g. searches per episode), None: none (a workflow whose agents share one such function
        gets it once);
    both are best a :class:`Folded` (a fold over one item at a time), so that a summary reads a run
    in one pass holding nothing per sample; a plain function gets every item at the end (`fold_of`);
    labels: the words a reader sees for its reasons and figures (``report.labels`` reads them; every
        figure it declares is shown under its own label, summary.json stores them), a label ending
        in ``(%)`` marks a share, ``(pts)`` points;
    formats: {figure: format} where the label's unit does not say it (`drmas_bench.figures.FORMATS`:
        share, points, count, number, counts)."""

    name: str
    reasons: Callable[[str], list[str]]
    reason_names: tuple[str, ...] = ()
    parse: Callable[[str], Parsed] = parse_nothing
    agent_figures: Callable[[list[str]], dict[str, Any]] | None = None
    episode_figures: Callable[[list[RecordView]], dict[str, Any]] | None = None
    labels: dict[str, str] = field(default_factory=dict)
    formats: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key, fmt in self.formats.items():  # a format that is not one, or contradicts its label: refused here
            try:
                Figure(key, self.labels.get(key, key), fmt)
            except ValueError as e:
                raise ValueError(f"format rule {self.name!r}: {e}") from None

    def __call__(self, text: str) -> list[str]:
        """``rule(text)`` is ``rule.reasons(text)`` (a rule reads like the function it was)."""
        return list(self.reasons(text))


RULES: Registry[FormatRule] = Registry("format rule", filled_by_suites=True)


def registered_rules() -> Registry[FormatRule]:
    """Every registered format rule, the suites discovered first (`drmas_bench.suites.discovery`)."""
    discover()
    return RULES


def check_rule(rule: FormatRule) -> FormatRule:
    """``rule`` when its fields are what they say (a function where a function goes, names as text),
    else one ValueError naming the rule and the field: a malformed rule is refused where it is
    declared (when its suite is discovered), not mid-run."""
    def bad(field_name: str, want: str, got: Any) -> DeclarationError:
        return DeclarationError(f"FormatRule {rule.name!r}: {field_name}: expected {want}, got {type(got).__name__} {got!r:.60}")

    if not isinstance(rule.name, str) or not rule.name:
        raise bad("name", "a non-empty string", rule.name)
    for f in ("reasons", "parse"):
        if not callable(getattr(rule, f)):
            raise bad(f, "a function of a reply's text", getattr(rule, f))
    for f in ("agent_figures", "episode_figures"):
        if getattr(rule, f) is not None and not callable(getattr(rule, f)):
            raise bad(f, "a function (or a Folded) or None", getattr(rule, f))
    if isinstance(rule.reason_names, str) or not all(isinstance(r, str) for r in rule.reason_names):
        raise bad("reason_names", "a tuple of reason names", rule.reason_names)
    if not isinstance(rule.labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in rule.labels.items()):
        raise bad("labels", "a mapping of name -> words", rule.labels)
    return rule


def format_rule(rule: FormatRule) -> FormatRule:
    """Register ``rule`` under its name (how a workflow may name it), its fields checked
    (`check_rule`); returns it."""
    RULES.register(check_rule(rule).name, rule)
    return rule


Rule = FormatRule | str | Callable[[str], list[str]]


def as_rule(rule: Rule) -> FormatRule:
    """A workflow's declared rule as a :class:`FormatRule`: the object itself, a registered name, or a
    bare function ``text -> reasons`` (a rule with nothing else to say, named after the function)."""
    if isinstance(rule, FormatRule):
        return check_rule(rule)
    if isinstance(rule, str):
        return registered_rules().get(rule)
    if not callable(rule):
        raise DeclarationError(f"a rule is a FormatRule, a registered rule's name or a function text -> reasons; "
                         f"got {type(rule).__name__} {rule!r:.60}")
    return FormatRule(getattr(rule, "__name__", repr(rule)), rule)


def ordered_reasons(rule: FormatRule, counts: dict[str, int]) -> dict[str, int]:
    """``counts`` (reason -> turns) in the rule's order (its ``reason_names``, then the rest sorted),
    reasons never seen left out."""
    order = (*rule.reason_names, *sorted(set(counts) - set(rule.reason_names)))
    return {k: counts[k] for k in order if counts.get(k)}


def episode_figures(rules: dict[str, FormatRule], records: list[RecordView]) -> dict[str, Any]:
    """The per-episode figures every rule of a workflow declares (each function once), over ``records``."""
    out: dict[str, Any] = {}
    for fn in episode_functions(rules):
        out.update(fn(records))
    return out


# ------------------------------------------------------------------------------ folds


class Fold(Protocol):
    """Figures computed one item at a time: ``add`` each item (a reply text, a `RecordView`), then
    ``result()``."""

    def add(self, item: Any) -> None: ...

    def result(self) -> dict[str, Any]: ...


class Folded:
    """A figure function over a list of items, defined by its fold (``make()`` gives a fresh one):
    ``Folded(make)(items)`` folds the items; a summary (`fold_of`) folds them as it reads the run."""

    def __init__(self, make: Callable[[], Fold]) -> None:
        self.make = make
        self.__doc__ = make.__doc__

    def __call__(self, items: Iterable[Any]) -> dict[str, Any]:
        f = self.make()
        for x in items:
            f.add(x)
        return f.result()


class ListFold:
    """The fold of a plain figure function: keeps every item and calls ``fn`` on the list at the end."""

    def __init__(self, fn: Callable[[list[Any]], dict[str, Any]]) -> None:
        self.fn = fn
        self.items: list[Any] = []

    def add(self, item: Any) -> None:
        self.items.append(item)

    def result(self) -> dict[str, Any]:
        return self.fn(self.items)


def fold_of(fn: Callable[..., dict[str, Any]]) -> Fold:
    """A fresh fold of figure function ``fn``: its own when it is a :class:`Folded`, else a `ListFold`."""
    return fn.make() if isinstance(fn, Folded) else ListFold(fn)


def episode_functions(rules: dict[str, FormatRule]) -> list[Callable[..., dict[str, Any]]]:
    """The distinct per-episode figure functions of a workflow's rules, in the rules' order."""
    out: list[Callable[..., dict[str, Any]]] = []
    for rule in rules.values():
        if rule.episode_figures is not None and rule.episode_figures not in out:
            out.append(rule.episode_figures)
    return out


class Verdicts:
    """A verifier's verdicts over its replies, one at a time (``verdict(text)``: its reading), the counts
    sorted by verdict."""

    def __init__(self, verdict: Callable[[str], str]) -> None:
        self.verdict = verdict
        self.counts: Counter = Counter()

    def add(self, text: str) -> None:
        self.counts[self.verdict(text)] += 1

    def result(self) -> dict[str, Any]:
        return {"verdicts": dict(sorted(self.counts.items()))}
