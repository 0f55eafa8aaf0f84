"""Everything a suite is made of, in one import: what a suite's author (a folder in
``drmas_bench/suites/``, or a package of one's own named in ``$DRMAS_SUITES`` or installed with a
``drmas_bench.suites`` entry point) needs, and nothing private.

    from drmas_bench.suite import Benchmark, Episode, FormatRule, Suite, Task, register, register_suite, workflow

A suite declares (docs/architecture.md has the recipe and a complete example, examples/suites/mcq/):

- its suite and benchmarks: :class:`Suite` (``register_suite``), :class:`Benchmark` (``register``),
  where the records come from (``files=`` under the data dir, a :class:`HubSource`, or
  ``generate=``) and how one becomes a :class:`Task` (``to_task=``: the ready loaders `qa_task` and
  `math_task`, or one's own with `first_field`, `record_id`, `answer_text`);
- how its answers are graded: a grading :class:`Family` (``register_family``): the ready ones
  `QA_FAMILY` (SQuAD exact match) and `MATH_FAMILY` (the boxed answer, by ``--grader``), or one's own
  ``Family(grade)`` with ``grade(pairs, timeout_s, math_grader) -> [(correct, extra), ...]``;
- its workflows: ``@workflow(name, agents=..., family=..., rules=...)`` over an async function of an
  :class:`Episode` (``await ep.<agent>(chat(system, user))`` -> a :class:`Turn`); each agent's reply
  format a :class:`FormatRule` (``format_rule`` registers it), with per-agent and per-episode
  figures (best a :class:`Folded`) with their labels and formats, its effects over the run's
  :class:`RecordView` records declared as :class:`Effects` of :class:`Figure` s (what summary.md, the
  viewer, the leaderboard, compare and sweep show);
- prompt templates (``placeholders=``, a ``<workflow>.prompts.yaml`` beside the module): the
  ``prompts: Templates`` and ``protocol: ProtocolOptions`` options and ``protocol.chat(tpl, role, ...)``.

What a finished episode is: a :class:`Trajectory` (its turns, final answer, reward); a bad record
or option is a :class:`UserError` (one line, exit 2).
"""

from __future__ import annotations

from drmas_bench.benchmarks.base import (
    Benchmark,
    HubSource,
    Sampled,
    answer_text,
    first_field,
    record_id,
    register,
)
from drmas_bench.benchmarks.loaders import math_task, normalize_question, qa_task
from drmas_bench.figures import Effects, Figure
from drmas_bench.grading.families import Family, register_family
from drmas_bench.grading.qa import grade_qa
from drmas_bench.grading.standard import MATH as MATH_FAMILY
from drmas_bench.grading.standard import QA as QA_FAMILY
from drmas_bench.records import RecordView, mean_or_none, rate
from drmas_bench.suites.registry import Suite, register_suite
from drmas_bench.types import SFTExample, Task, Trajectory, Turn, UserError
from drmas_bench.workflows import protocol
from drmas_bench.workflows.base import Episode, chat, workflow
from drmas_bench.workflows.protocol import ProtocolOptions, Templates
from drmas_bench.workflows.rules import Folded, FormatRule, Verdicts, format_rule

__all__ = [
    # the suite and its benchmarks
    "Benchmark", "HubSource", "Sampled", "Suite", "register", "register_suite",
    # the record loaders and their helpers
    "qa_task", "math_task", "normalize_question", "answer_text", "first_field", "record_id",
    # grading
    "Family", "register_family", "QA_FAMILY", "MATH_FAMILY", "grade_qa",
    # workflows, their format rules and figures
    "workflow", "Episode", "chat", "FormatRule", "format_rule", "Folded", "Verdicts", "RecordView", "mean_or_none",
    "rate", "SFTExample", "Effects", "Figure",
    # prompt templates
    "protocol", "Templates", "ProtocolOptions",
    # the records that flow
    "Task", "Trajectory", "Turn", "UserError",
]
