"""summary.md of a finished eval (``run_summary_markdown``): the line naming a spending limit that
stopped it, the figures (``report.markdown.format_summary_markdown``), then one line each on the run's
reproducibility, its prompts, its call cache and what its server engines learned."""

from __future__ import annotations

from typing import Any

from drmas_bench.report.labels import reproducibility_text, stopped_text
from drmas_bench.report.markdown import format_summary_markdown


def protocol_markdown(pr: dict[str, Any]) -> str:
    """summary.md's prompts line (summary.json's ``protocol``: the prompts' source and hash, the prompt
    limit, how many calls had their prompt truncated or their limit not enforced); "" for a run
    without prompt templates."""
    if "prompts_sha256" not in pr:
        return ""
    return (f"\n- prompts: {pr['prompts_source']} (sha256 {pr['prompts_sha256'][:12]}); prompt limit "
            f"{pr['max_prompt_tokens'] or 'none'} tokens ({pr['truncate']}); truncated prompts: "
            f"{pr['prompt_truncated_calls']} of {pr['calls']} calls"
            + (f"; limit NOT enforced on {pr['prompt_limit_unenforced_calls']} calls (no tokenizer here or on the "
               "server)" if pr["prompt_limit_unenforced_calls"] else "") + "\n")


def cache_markdown(section: dict[str, Any] | None) -> str:
    """summary.md's cache lines (summary.json's ``cache``): the totals, then one line per agent."""
    if not section:
        return ""
    lines = [f"\n- call cache {section['dir'] or '(not used this time)'}: {section['hits']} hits, "
             f"{section['misses']} calls computed"]
    for name, a in section["agents"].items():
        usd = "unknown $" if a["usd_saved"] is None else f"${a['usd_saved']:.4f}"
        lines.append(f"  - {name}: {a['hits']} hits, {a['misses']} misses; saved {a['tokens_saved']} tokens, "
                     f"{usd}, {a['seconds_saved']:.1f} s")
    return "\n".join(lines) + "\n"


def engine_notes_markdown(pool_stats: dict[str, Any] | None) -> str:
    """summary.md's lines for what the server engines learned about their servers (summary.json:
    ``pool.groups.<wg>.engine_notes``): how a field was sent, sampling a server applies unasked."""
    lines = [f"  - {wg}: {note}" for wg, g in ((pool_stats or {}).get("groups") or {}).items()
             for note in g.get("engine_notes") or []]
    return ("\n- engine notes (the server's dialect):\n" + "\n".join(lines) + "\n") if lines else ""


def limit_stop_markdown(run: dict[str, Any] | None) -> str:
    """summary.md's first line for a run a spending limit stopped (summary.json's ``run.stopped``,
    drmas_bench.limits); '' for a run that was not."""
    stop = (run or {}).get("stopped")
    if not isinstance(stop, dict):
        return ""
    return "> **" + stopped_text(stop).replace(": ", ":** ", 1) + "\n\n"


def reproducibility_markdown(block: dict[str, Any] | None) -> str:
    """summary.md's one line on the run's reproducibility (summary.json's ``reproducibility``); ''
    for a summary written before the block existed."""
    return "\n" + reproducibility_text(block) + "\n" if block else ""


def run_summary_markdown(summary: dict[str, Any]) -> str:
    """A finished eval's summary.md: the line naming a spending limit that stopped it, then
    `format_summary_markdown`, the reproducibility line, the prompts line, the call cache's lines and the
    engines' notes, each from its section of summary.json (``run``, ``reproducibility``, ``protocol``,
    ``cache``, ``pool``)."""
    return (limit_stop_markdown(summary.get("run")) + format_summary_markdown(summary)
            + reproducibility_markdown(summary.get("reproducibility"))
            + protocol_markdown(summary.get("protocol") or {}) + cache_markdown(summary.get("cache"))
            + engine_notes_markdown(summary.get("pool")))
