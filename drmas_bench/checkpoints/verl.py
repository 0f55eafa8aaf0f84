"""A checkpoint written by the reference trainer (the verl fork of Dr. MAS), read as a team.

The reference saves, for each step it checkpoints::

    ROOT/latest_checkpointed_iteration.txt       the newest step, e.g. "150"
    ROOT/global_step_N/actor/<wg_id>/            one folder per worker group: the model shards
                                                 (verl_merge), the config and tokenizer (beside them
                                                 or in huggingface/), with LoRA lora_adapter/
    ROOT/global_step_N/data.pt                   the dataloader state (not read here)

``wg_id`` names the model and its agents: one agent per group ``"<model>_<agent id>"`` (spaces
kept: ``"Qwen2.5-7B_Verifier Agent"``), a shared group ``"<model>_" + "_".join(agent ids without
spaces)`` (``"Qwen2.5-7B_VerifierAgent_SearchAgent_AnswerAgent"``). The agent ids are the
reference's agent registry names, mapped here to this project's workflows and agents
(a :class:`Roster` the caller builds from the names the suites give their agents: ``Suite.agent_names``); the workflow (and so the suite) is the one whose agents the checkpoint
holds exactly.

:func:`team_folder` turns ``ROOT`` or ``ROOT/global_step_N`` into a team folder in the model cache,
``<cache>/checkpoints/verl-<key>/``: ``team.yaml`` plus ``models/<wg>/`` (a merged Hugging Face
folder, or for LoRA an adapter folder beside its merged base ``models/<wg>.base/``). ``key`` hashes
the shards' content identity (names, sizes, modification times, and the first and last MiB of each
file), so a second eval finds the folder at once and a changed shard merges again; one lock per
key (``<cache>/locks``) makes two evals at once merge once; the merge is written into a partial
folder renamed into place, so a failed merge leaves no team folder behind, and the next attempt
keeps the worker groups it had finished. The team folder is then evaluated like any checkpoint
folder holding a ``team.yaml``. ``plan()`` only finds what would be merged (:func:`plan_merge`:
read, nothing written); the run, or ``drmas-bench models prepare ROOT``, merges.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import yaml

from drmas_bench.checkpoints.adapter_names import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from drmas_bench.files import cache_dir
from drmas_bench.preparation import Bar, Step
from drmas_bench.types import UserError
from drmas_retrieval.locks import file_lock

logger = logging.getLogger(__name__)

LATEST_FILE = "latest_checkpointed_iteration.txt"
STEP_DIR = re.compile(r"^global_step_(\d+)$")
LORA_DIR = "lora_adapter"
MERGE_VERSION = 1  # part of the cache key: a change to how groups are merged merges them again

@dataclass(frozen=True)
class Roster:
    """What the suites say of the reference's agent ids, handed in by the caller (this package sits
    below the suites and workflows: ``needs.reference_roster()`` builds it). ``teams``: workflow ->
    {the reference's agent id: this workflow's agent}, for every workflow whose suite names all its
    agents (``Suite.agent_names``), in workflow-name order; ``suite_of``: workflow -> its suite;
    ``defaults``: the suites' default workflows (preferred when several fit)."""

    teams: dict[str, dict[str, str]]
    suite_of: dict[str, str | None]
    defaults: frozenset[str]


def known_ids(roster: Roster) -> list[str]:
    return sorted({a for m in roster.teams.values() for a in m})


def is_reference_checkpoint(path: str | os.PathLike) -> bool:
    """``ROOT`` (with ``latest_checkpointed_iteration.txt``) or ``ROOT/global_step_N`` (with
    ``actor/<wg>/model_world_size_*_rank_*.pt``) of the reference trainer."""
    p = Path(path)
    if not p.is_dir():
        return False
    if (p / LATEST_FILE).is_file():
        return True
    actor = p / "actor"
    return actor.is_dir() and any(d.is_dir() and any(d.glob("model_world_size_*_rank_*.pt")) for d in actor.iterdir())


def step_folder(path: str | os.PathLike) -> Path:
    """``ROOT`` -> ``ROOT/global_step_N`` (N from ``latest_checkpointed_iteration.txt``); a step folder as it is."""
    p = Path(path)
    if not (p / LATEST_FILE).is_file():
        return p
    text = (p / LATEST_FILE).read_text(encoding="utf-8", errors="replace").strip()
    if not text.isdigit():
        raise UserError(f"{p / LATEST_FILE}: expected a step number, got {text[:40]!r}")
    step = p / f"global_step_{int(text)}"
    if not (step / "actor").is_dir():
        raise UserError(f"{p / LATEST_FILE} names step {int(text)}, but {step}/actor does not exist")
    return step


def agents_of(wg_id: str, roster: Roster) -> list[str]:
    """The reference agent ids a worker-group name holds (module docstring), read whole: every
    ``_``-separated segment at the end of the name that ends in ``Agent`` is an agent id (with or
    without its spaces), the rest is the model's name. An id the workflows do not know, wherever it
    stands among them, is one line naming it and the known ones."""
    known = {a.replace(" ", ""): a for a in known_ids(roster)}
    segments = wg_id.split("_")
    ids: list[str] = []
    while len(segments) > 1 and segments[-1].strip().endswith("Agent"):
        ids.insert(0, segments.pop().strip())
    unknown = next((a for a in ids if a.replace(" ", "") not in known), None)
    if not ids or unknown is not None:
        name = unknown if unknown is not None else wg_id.rsplit("_", 1)[-1]
        raise UserError(f"worker group {wg_id!r}: agent id {name!r} is not one the workflows know "
                        f"(known: {', '.join(known_ids(roster))})")
    return [known[a.replace(" ", "")] for a in ids]


@dataclass
class ReferenceTeam:
    step: Path  # ROOT/global_step_N
    workflow: str
    suite: str
    groups: dict[str, Path]  # wg_id -> actor/<wg_id>
    agents: dict[str, str]  # this workflow's agent -> wg_id


def read_team(path: str | os.PathLike, roster: Roster, workflow: str | None = None,
              suite: str | None = None) -> ReferenceTeam:
    """The worker groups, agents and workflow of a reference checkpoint (nothing merged yet).
    ``workflow`` / ``suite`` (the flags, when given) choose among the workflows that fit."""

    step = step_folder(path)
    actor = step / "actor"
    groups = {d.name: d for d in sorted(actor.iterdir()) if d.is_dir() and not d.is_symlink()} if actor.is_dir() else {}
    if not groups:
        raise UserError(f"{step}: no worker group folders under actor/")
    holder: dict[str, str] = {}
    for wg in groups:
        for a in agents_of(wg, roster):
            if a in holder:
                raise UserError(f"{step}: agent {a!r} is in two worker groups ({holder[a]!r}, {wg!r})")
            holder[a] = wg
    teams = roster.teams
    fits = [w for w, m in teams.items() if set(m) == set(holder)]
    if workflow:
        if workflow not in fits:
            raise UserError(f"{step}: --workflow {workflow} does not take the checkpoint's agents "
                            f"({', '.join(sorted(holder))})")
        fits = [workflow]
    suites = {w: roster.suite_of.get(w) for w in fits}
    if suite:
        fits = [w for w in fits if suites[w] == suite]
    if not fits:
        _no_fit(step, holder, suite, roster)
    # several fit: the suite's default workflow first
    w = next((w for w in fits if w in roster.defaults), fits[0])
    return ReferenceTeam(step, w, suites[w], groups, {teams[w][a]: wg for a, wg in holder.items()})


def _no_fit(step: Path, holder: dict, suite: str | None, roster: Roster):
    wants = "; ".join(f"{w}: {' + '.join(m)}" for w, m in roster.teams.items())
    where = f" in suite {suite}" if suite else ""
    raise UserError(f"{step}: no workflow{where} has exactly the agents {', '.join(sorted(holder))} ({wants})")


def group_name(wg_id: str, taken: set[str]) -> str:
    """A worker-group name for the team file (letters, digits, ``_ - .``) from a reference wg_id."""
    name = re.sub(r"\.{2,}", ".", re.sub(r"[^A-Za-z0-9_.-]+", "_", wg_id)).strip("._") or "wg"
    base, i = name, 2
    while name in taken:
        name, i = f"{base}-{i}", i + 1
    return name


# ------------------------------------------------------------------------------ the cache key


def _file_identity(f: Path, h: Any) -> None:
    st = f.stat()
    h.update(f"{f.name}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    with open(f, "rb") as fh:
        h.update(fh.read(1 << 20))
        if st.st_size > 2 << 20:
            fh.seek(-(1 << 20), os.SEEK_END)
            h.update(fh.read(1 << 20))


def content_key(team: ReferenceTeam) -> str:
    """The key of the merged team (module docstring)."""
    h = hashlib.sha256(f"verl-merge {MERGE_VERSION} {team.workflow}\0".encode())
    for wg, folder in sorted(team.groups.items()):
        h.update(f"group {wg}\0".encode())
        for sub in (folder, folder / "huggingface", folder / LORA_DIR):
            if sub.is_dir():
                for f in sorted(sub.iterdir()):
                    if f.is_file() and not f.name.startswith(("optim_world_size_", "extra_state_world_size_")):
                        _file_identity(f, h)
    return h.hexdigest()[:16]


# ------------------------------------------------------------------------------ merging


def _peft_base_name(key: str) -> str | None:
    """A LoRA model's shard key -> the base model's name (``base_model.model.`` and ``.base_layer``
    removed), or None for the adapter's own tensors."""
    if ".lora_" in key or "lora_embedding" in key:
        return None
    key = key.removeprefix("base_model.model.")
    return key.replace(".base_layer.", ".")


def _write_group(wg_id: str, folder: Path, tmp: Path, name: str, final: Path, show: bool) -> dict[str, Any]:
    # the merge needs torch; deferred so that telling a reference checkpoint from a team folder
    # (`is_reference_checkpoint`, asked while an evaluation is planned) stays light
    from drmas_bench.checkpoints import verl_merge

    lora = folder / LORA_DIR
    if lora.is_dir():
        if not (lora / ADAPTER_CONFIG).is_file() or not (lora / ADAPTER_WEIGHTS).is_file():
            raise UserError(f"{lora}: a LoRA adapter folder needs {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS}")
        base = tmp / "models" / f"{name}.base"
        info = verl_merge.merge_group(folder, base, rename=_peft_base_name, progress=Bar(f"merge {wg_id} (base)", show))
        adapter = tmp / "models" / name
        adapter.mkdir(parents=True)
        try:
            cfg = json.loads((lora / ADAPTER_CONFIG).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise UserError(f"{lora / ADAPTER_CONFIG}: cannot read ({type(e).__name__})") from None
        if not isinstance(cfg, dict):
            raise UserError(f"{lora / ADAPTER_CONFIG}: not a JSON object")
        cfg["base_model_name_or_path"] = str(final / "models" / f"{name}.base")  # the merged base, in the cache
        (adapter / ADAPTER_CONFIG).write_text(json.dumps(cfg, indent=2), encoding="utf-8")
        shutil.copyfile(lora / ADAPTER_WEIGHTS, adapter / ADAPTER_WEIGHTS)
        return {**info, "lora": True}
    return verl_merge.merge_group(folder, tmp / "models" / name, progress=Bar(f"merge {wg_id}", show))


def merged_folder(key: str) -> Path:
    """Where the team merged from shards of content key ``key`` lives: ``<cache>/checkpoints/verl-<key>``."""
    return cache_dir() / "checkpoints" / f"verl-{key}"


def _shard_bytes(team: ReferenceTeam) -> int:
    """The bytes a merge reads: every group's model shards (and a LoRA adapter's weights)."""
    return sum(f.stat().st_size for folder in team.groups.values()
               for f in [*folder.glob("model_world_size_*_rank_*.pt"), *(folder / LORA_DIR).glob(ADAPTER_WEIGHTS)])


@dataclass(frozen=True)
class ReferenceMerge(Step):
    """A reference checkpoint's worker groups merged into a team folder in the cache (:func:`team_folder`)."""

    action: ClassVar[str] = "merge reference checkpoint"
    team: ReferenceTeam | None = field(default=None, compare=False)  # what read_team found (the flags chose among the workflows that fit)

    def perform(self, show_progress: bool) -> Path:
        assert self.team is not None, "plan_merge gives the step its team"
        return merge_team(self.team, show_progress=show_progress)


def plan_merge(path: str | os.PathLike, roster: Roster, workflow: str | None = None,
               suite: str | None = None) -> tuple[ReferenceMerge, ReferenceTeam]:
    """What :func:`team_folder` would do for ``path``, found without doing it: the team read, its
    content key computed (the shards are read, not loaded), nothing written and no lock taken."""
    team = read_team(path, roster, workflow=workflow, suite=suite)
    final = merged_folder(content_key(team))
    done = (final / "team.yaml").is_file()
    step = ReferenceMerge(str(path), final, None if done else _shard_bytes(team), done, team)
    return step, team


def team_folder(path: str | os.PathLike, roster: Roster, workflow: str | None = None, suite: str | None = None,
                show_progress: bool = True) -> tuple[Path, ReferenceTeam]:
    """The merged team folder of reference checkpoint ``path`` (module docstring), merged if needed."""
    team = read_team(path, roster, workflow=workflow, suite=suite)
    return merge_team(team, show_progress=show_progress), team


def merge_team(team: ReferenceTeam, show_progress: bool = True) -> Path:
    """``team``'s merged folder in the cache, merged if needed. The merge goes to
    ``.part-verl-<key>``, one worker group at a time; a group is finished when its name is in
    ``.done/``, so a merge cut short goes on with the groups it had not finished."""
    key = content_key(team)
    final = merged_folder(key)
    with file_lock(cache_dir() / "locks" / f"verl-{key}.lock"):
        if (final / "team.yaml").is_file():
            return final
        tmp = final.with_name(f".part-verl-{key}")
        done = tmp / ".done"
        done.mkdir(parents=True, exist_ok=True)
        names: dict[str, str] = {}
        try:
            for wg_id, folder in team.groups.items():
                names[wg_id] = group_name(wg_id, set(names.values()))
                if (done / names[wg_id]).is_file():
                    logger.info(f"[merge] {team.step.name}/actor/{wg_id}: merged earlier, kept")
                    continue
                for old in (tmp / "models" / names[wg_id], tmp / "models" / f"{names[wg_id]}.base"):
                    shutil.rmtree(old, ignore_errors=True)  # what a cut merge of this group left
                logger.info(f"[merge] {team.step.name}/actor/{wg_id} -> models/{names[wg_id]}")
                _write_group(wg_id, folder, tmp, names[wg_id], final, show_progress)
                (done / names[wg_id]).write_text(wg_id, encoding="utf-8")
        except UserError:  # a shard refused: nothing to go on from (a fixed shard is another key)
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        doc = {"workflow": team.workflow,
               "worker_groups": {names[wg]: {"model": f"models/{names[wg]}"} for wg in team.groups},
               "agents": {agent: names[wg] for agent, wg in team.agents.items()}}
        (tmp / "team.yaml").write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        (tmp / "source.json").write_text(json.dumps(
            {"kind": "verl", "step": str(team.step), "groups": {names[wg]: wg for wg in team.groups}}, indent=2))
        shutil.rmtree(done)
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
    return final
