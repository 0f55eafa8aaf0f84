"""Reports over run directories: leaderboards, paired comparisons and cost studies.

Everything here reads what `drmas-bench eval` wrote (``config.yaml`` + ``samples.jsonl``) and
recomputes its numbers from the recorded trajectories with the functions `summarize` uses
(`drmas_bench.metrics`: question counts, avg@n / pass@k, bootstrap CIs, seeds, $ per call); nothing
trusts a stale ``summary.json``. One module per concern:

- `report.runs`: `Run`, `load_run`, `load_runs`, `expand_run_dirs` (records via `run_samples.read_samples`).
- `report.leaderboard`: `build_leaderboard` (its tables as data: `report.tables`, `parse_metrics`);
  `report.paper`: the paper's reported rows; `report.tables_csv`: the wide CSV (`tables_csv`) and the
  long CSV (`tables_long_csv`: run, benchmark, metric, value, ci_lo, ci_hi).
- `report.compare`: `compare_runs` (paired bootstrap, exact sign test, flipped questions).
- `report.cost`: `cost_study`, `cost_csv`, `pareto_front`, `plot_pareto`.
- `report.markdown`: every Markdown rendering (run summaries included).

Team files for heterogeneous assignments live beside teams, in `drmas_bench.agents.assign` (also
re-exported here). See docs/leaderboards.md and docs/cost.md.
"""

from __future__ import annotations

from drmas_bench.agents.assign import (
    assignment_name,
    assignment_team,
    enumerate_assignments,
    workflow_for_agents,
    write_assignment_teams,
)
from drmas_bench.metrics import Question, bootstrap_mean_ci, questions
from drmas_bench.report.compare import Comparison, Flip, PairedResult, compare_runs, sign_test_p
from drmas_bench.report.cost import (
    AgentCost,
    TeamCost,
    cost_csv,
    cost_notes,
    cost_study,
    pareto_front,
    plot_pareto,
    run_turn_cost,
    team_cost,
)
from drmas_bench.report.leaderboard import build_leaderboard, per_question_values, run_row
from drmas_bench.report.markdown import (
    compare_markdown,
    cost_markdown,
    format_summary_markdown,
    leaderboard_markdown,
    table_markdown,
)
from drmas_bench.report.paper import PAPER_FILE, PAPER_PROTOCOL, PAPER_STATUS, load_paper, paper_rows, validate_paper
from drmas_bench.report.runs import SAMPLING_KEYS, Run, expand_run_dirs, load_run, load_runs
from drmas_bench.report.tables import Cell, Metric, Row, Table, parse_metrics
from drmas_bench.report.tables_csv import data_file_name, long_csv_path, suite_csv_paths, tables_csv, tables_long_csv
from drmas_bench.run_samples import read_samples

__all__ = [
    "AgentCost", "Cell", "Comparison", "Flip", "Metric", "PAPER_FILE", "PAPER_PROTOCOL", "PAPER_STATUS",
    "PairedResult", "Question", "Row", "Run", "SAMPLING_KEYS", "Table", "TeamCost", "assignment_name",
    "assignment_team", "bootstrap_mean_ci", "build_leaderboard", "compare_markdown", "compare_runs", "cost_csv",
    "cost_markdown", "cost_notes", "cost_study", "data_file_name", "enumerate_assignments", "expand_run_dirs",
    "format_summary_markdown", "leaderboard_markdown", "load_paper", "long_csv_path", "load_run", "load_runs", "paper_rows",
    "pareto_front", "parse_metrics", "per_question_values", "plot_pareto", "questions", "read_samples", "run_row",
    "sign_test_p", "suite_csv_paths", "table_markdown", "tables_csv", "tables_long_csv", "team_cost", "run_turn_cost",
    "validate_paper", "workflow_for_agents", "write_assignment_teams",
]
