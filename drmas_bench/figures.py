"""How a suite declares the figures it adds to a run's summary, so that every report shows them.

A workflow's effects block (``@workflow(effects=Effects(key, fn, figures=[...]))``) and a format
rule's per-agent and per-episode figures (``FormatRule(labels=..., formats=...)``) name each figure
with the words a reader sees and how its value is written, as Inspect's ``@scorer(metrics=[...])``
or lm-eval's ``metric_list`` declare what is reported. summary.json, summary.md, the viewer, the
leaderboard, ``compare`` and ``sweep`` draw whatever is declared (`drmas_bench.report`), with no
branch on a suite's or a workflow's name.

A figure's format is carried by its label's unit, so the label alone (what summary.json stores)
says how to write the value: a ``share`` (a fraction in [0, 1]) is labelled ``... (%)``, ``points``
(a difference of two shares) ``... (pts)``; ``count``, ``number`` and ``counts`` need no unit.
`Figure.words` adds the unit when the label lacks it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

# format -> how a value in it is written (the report's `labels.figure_text` writes them)
FORMATS: dict[str, str] = {
    "auto": "from the label's unit ('(%)': share, '(pts)': points), else from the value",
    "share": "a fraction in [0, 1], written in % (label unit '(%)')",
    "points": "a difference of two shares, written in percentage points with a sign (label unit '(pts)')",
    "count": "a whole number, as it is",
    "number": "a real number, two decimals",
    "counts": "{name: count}, written as 'name n' pairs",
}
UNITS = {"share": " (%)", "points": " (pts)"}  # the label unit a format carries
# keys an effects block sits beside in summary.json's ``effects`` (the block's own key must differ)
RESERVED_KEYS = ("workflow", "agents", "benchmarks", "labels")
PLACEHOLDER = re.compile(r"\{([^{}]+)\}")  # a figure's written value in a phrase or note: {key}
# a part of a phrase or note written only when every figure it names is there and not 0: [ ... {key} ...]
OPTIONAL = re.compile(r"\[([^\[\]]*\{[^{}]+\}[^\[\]]*)\]")


def format_of_label(label: str) -> str:
    """The format a label's unit implies: share for '(%)', points for '(pts)', else auto."""
    for fmt, unit in UNITS.items():
        if label.endswith(unit.strip()):
            return fmt
    return "auto"


@dataclass(frozen=True)
class Figure:
    """One declared figure of a summary block.

    key: where it is in the block; a dotted key reaches into a nested dict (``flips.wrong_to_right``);
    label: the words a reader sees (units in parentheses; `words` adds the format's unit);
    format: one of `FORMATS` ("auto": from the label's unit, else from the value)."""

    key: str
    label: str
    format: str = "auto"

    def __post_init__(self) -> None:
        if not self.key or not self.label:
            raise ValueError(f"figure {self.key!r}: give it a key and a label")
        if self.format not in FORMATS:
            raise ValueError(f"figure {self.key!r}: format {self.format!r} is not one of {', '.join(FORMATS)}")
        implied = format_of_label(self.label)
        if implied != "auto" and self.format not in ("auto", implied):
            raise ValueError(f"figure {self.key!r}: its label {self.label!r} says {implied}, its format {self.format}")

    @property
    def words(self) -> str:
        """The label with its format's unit: what summary.json stores and every report shows."""
        unit = UNITS.get(self.format, "")
        return self.label if not unit or self.label.endswith(unit.strip()) else self.label + unit


class Effects(NamedTuple):
    """A workflow's effects block: ``fn(records)`` returns the block, stored in summary.json under
    ``effects.<key>`` (over every record and per benchmark); ``figures`` name its figures in the order
    a reader sees them (a key of the block no figure names is still shown, after them, in words made
    from its key); ``phrase`` is the block in one line for a leaderboard cell, ``{key}`` standing for
    a figure's written value ("": the first three figures, labelled); ``note`` sentences under its
    table, over all records, written the same way. In both, a part in square brackets that names a
    figure (``[ ({round1_ungraded} never graded)]``) is written only when each figure it names is
    there and not 0. A plain ``(key, fn)`` pair is an `Effects` with nothing declared."""

    key: str
    fn: Callable[[list[Any]], dict[str, Any]]
    figures: tuple[Figure, ...] = ()
    phrase: str = ""
    note: str = ""


def as_effects(decl: Any) -> Effects:
    """A workflow's declared effects as `Effects` (a plain ``(key, fn)`` pair, or an ``Effects`` whose
    figures may be given as a list or as ``{key: label}``), checked: one ValueError naming the field."""
    if isinstance(decl, Effects):
        eff = decl
    elif isinstance(decl, tuple) and len(decl) == 2:
        eff = Effects(decl[0], decl[1])
    else:
        raise ValueError(f"effects: expected Effects(key, fn, ...) or a (key, fn) pair, got {decl!r}")
    figures = eff.figures
    if isinstance(figures, Mapping):
        figures = tuple(Figure(k, v) for k, v in figures.items())
    figures = tuple(figures)
    if not isinstance(eff.key, str) or not eff.key or eff.key in RESERVED_KEYS:
        raise ValueError(f"effects: key {eff.key!r} must be a name other than {', '.join(RESERVED_KEYS)}")
    if not callable(eff.fn):
        raise ValueError(f"effects {eff.key!r}: fn {eff.fn!r} is not callable")
    bad = [f for f in figures if not isinstance(f, Figure)]
    if bad:
        raise ValueError(f"effects {eff.key!r}: figures must be Figure(key, label, format), got {bad[0]!r}")
    keys = [f.key for f in figures]
    if len(set(keys)) != len(keys):
        raise ValueError(f"effects {eff.key!r}: a figure is declared twice ({', '.join(sorted(k for k in set(keys) if keys.count(k) > 1))})")
    for name, text in (("phrase", eff.phrase), ("note", eff.note)):
        unknown = [k for k in PLACEHOLDER.findall(text) if k not in keys]
        if unknown:
            raise ValueError(f"effects {eff.key!r}: {name} names {', '.join(unknown)}, not a declared figure")
    return eff._replace(figures=figures)


def labels_of(figures: Iterable[Figure]) -> dict[str, str]:
    """{key: words} of figures, in their order."""
    return {f.key: f.words for f in figures}


def rule_labels(rules: Iterable[Any]) -> dict[str, str]:
    """{key: words} that format rules declare (their reasons' and figures' ``labels``, each with the
    unit of its declared ``formats`` entry), the first rule's words where two name one key."""
    out: dict[str, str] = {}
    for rule in rules:
        formats = getattr(rule, "formats", {}) or {}
        for key, words in rule.labels.items():
            out.setdefault(key, Figure(key, words, formats.get(key, "auto")).words)
        for key, fmt in formats.items():
            if key not in rule.labels:
                out.setdefault(key, Figure(key, key.replace("_", " "), fmt).words)
    return out


def lookup(block: Mapping[str, Any], key: str) -> tuple[bool, Any]:
    """(found, value) of a dotted ``key`` in ``block``."""
    cur: Any = block
    for part in key.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return False, None
        cur = cur[part]
    return True, cur


def fill(template: str, block: Mapping[str, Any], write: Callable[[str, Any], str]) -> str:
    """``template`` (a declared phrase or note) with each ``{key}`` replaced by ``write(key, value)``
    of that figure of ``block``, and each optional ``[...]`` part kept only when every figure it
    names is there and not 0 (its brackets dropped)."""

    def optional(m: re.Match) -> str:
        values = [lookup(block, k)[1] for k in PLACEHOLDER.findall(m.group(1))]
        return m.group(1) if all(v not in (None, 0, {}, []) for v in values) else ""

    text = OPTIONAL.sub(optional, template)
    return PLACEHOLDER.sub(lambda m: write(m.group(1), lookup(block, m.group(1))[1]), text)


def shown_keys(blocks: Sequence[Mapping[str, Any]], labels: Mapping[str, str]) -> list[str]:
    """The keys a report shows of an effects block (over ``blocks``, the same block per benchmark and
    over all): the labelled keys present in a block, in label order, then every other key of a block
    that no shown key covers (``flips`` is covered by ``flips.wrong_to_right``)."""
    out = [k for k in labels if any(lookup(b, k)[0] for b in blocks)]
    for b in blocks:
        for k in b:
            if k not in out and not any(s.startswith(k + ".") for s in out):
                out.append(k)
    return out
