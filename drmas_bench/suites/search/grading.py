"""The search suite's grading family (``qa``): SQuAD exact match of the final answer
(`grading.standard.QA`)."""

from __future__ import annotations

from drmas_bench.suite import QA_FAMILY, register_family

register_family("qa", QA_FAMILY)
