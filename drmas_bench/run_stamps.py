"""What each sample records of the run that made it (``run_stamp``), and how a resume finds a kept
sample that another run made (``sample_mismatch``: other sampling, worker groups, models, workflow
or benchmark file; ``mismatch_signature``: what it reads, so ``run_index`` checks one record per
signature). Used by ``run_dir.RunDir`` when it appends and when it resumes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from drmas_bench.files import fingerprint
from drmas_bench.run_index import signature

STAMP_SAMPLING = ("temperature", "top_p", "max_new_tokens", "top_k", "enable_thinking")


def _model_tag(m: Any) -> str:
    """``folder-name:content-hash`` (or the name of a model known by name only)."""
    if isinstance(m, dict) and m.get("content"):
        return f"{Path(str(m.get('path') or '?')).name}:{str(m['content'])[:8]}"
    return str(m.get("name") or "?") if isinstance(m, dict) else str(m)


def run_stamp(config: dict[str, Any], benchmark: str) -> dict[str, Any]:
    """What each sample records of the run that made it: the identity's fingerprint (team, models,
    sampling, seed, retriever, prompts, grader), and readable parts of it for messages."""
    ident = config.get("identity") or {}
    return {"identity": fingerprint(ident), "workflow": config.get("workflow"),
            "models": {str(wg): _model_tag(m) for wg, m in (ident.get("models") or {}).items()},
            "data": str((config.get("data") or {}).get(benchmark) or "")[:23]}


def _agent_wg(team: dict[str, Any], agent: str) -> str | None:
    v = (team.get("agents") or {}).get(agent)
    return v.get("wg") if isinstance(v, dict) else v


def mismatch_signature(rec: dict[str, Any]) -> str:
    """A hash of everything ``sample_mismatch`` reads of ``rec`` (its benchmark, each turn's agent,
    worker group and ``STAMP_SAMPLING`` values, its run stamp): two records with one signature get
    the same answer from it, so a resume checks one record per signature (``run_index``)."""
    turns = [(t.get("agent"), t.get("wg"), {k: v for k, v in ((t.get("request") or {}).get("sampling") or {}).items()
                                            if k in STAMP_SAMPLING}) for t in rec.get("turns") or ()]
    return signature([str(rec["task"]["benchmark"]), turns, rec.get("run")])


def sample_mismatch(rec: dict[str, Any], config: dict[str, Any], stamps: dict[str, dict] | None = None) -> list[str]:
    """How a kept sample differs from the run ``config`` describes ([] = no difference found).

    Every record's turns say which agent spoke through which worker group with which sampling; a
    record with a stamp (``run_stamp``) also says which models, workflow and benchmark file made it.
    ``stamps``: a cache of ``config``'s stamp per benchmark, for checking many records."""
    ident = config.get("identity") or {}
    sampling, team = ident.get("sampling") or {}, ident.get("team") or {}
    diffs: list[str] = []
    for t in rec.get("turns") or []:
        agent = t.get("agent")
        if sampling and agent not in sampling:
            diffs.append(f"agent {agent!r}, which this team does not have")
            break
        got, want = (t.get("request") or {}).get("sampling") or {}, sampling.get(agent) or {}
        diffs += [f"{agent} {k} {got[k]!r} (now {want[k]!r})" for k in STAMP_SAMPLING
                  if k in got and k in want and got[k] != want[k]]
        wg = _agent_wg(team, agent) if team else None
        if wg is not None and t.get("wg") not in (None, wg):
            diffs.append(f"{agent} served by worker group {t.get('wg')!r} (now {wg!r})")
        if diffs:
            break
    stamp = rec.get("run")
    if isinstance(stamp, dict):
        b = str(rec["task"]["benchmark"])
        now = stamps[b] if stamps is not None and b in stamps else run_stamp(config, b)
        if stamps is not None:
            stamps[b] = now
        if stamp.get("workflow") and now["workflow"] and stamp["workflow"] != now["workflow"]:
            diffs.append(f"workflow {stamp['workflow']} (now {now['workflow']})")
        was = stamp.get("models") or {}
        diffs += [f"model of {wg} {was.get(wg, '-')} (now {now['models'].get(wg, '-')})"
                  for wg in sorted(set(was) | set(now["models"])) if was.get(wg) != now["models"].get(wg)]
        if stamp.get("data") and now["data"] and stamp["data"] != now["data"]:
            diffs.append(f"benchmark file {rec['task']['benchmark']} {stamp['data']} (now {now['data']})")
        if not diffs and stamp.get("identity") != now["identity"]:
            diffs.append("team, seed, retriever, prompts or grader")
    return diffs
