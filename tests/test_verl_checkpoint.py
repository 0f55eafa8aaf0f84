"""Reference-trainer (verl FSDP) checkpoints evaluated as they come: the merge, the agents, the cache,
the refusals, and evals that match the original models completion for completion.

The fast tests write shards in this process (plain tensors, and pickles naming classes that are not
allowed); the slow ones use checkpoints made by real sharding (``tests/verl_fixtures.py``: two gloo
processes, FSDP2 ``fully_shard`` and FSDP1's sharded state dict, built once per session)."""

from __future__ import annotations

import json
import os
import shutil
import threading
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from drmas_bench.api import EvalConfig, resolve
from drmas_bench.cli import main
from drmas_bench.models import resolve_model
from drmas_bench.checkpoints import verl as verl_ckpt, verl_merge
from drmas_bench.checkpoints.verl import agents_of, read_team, team_folder
from drmas_bench.needs import reference_roster
from drmas_bench.types import UserError

from conftest import find_data_dir

ROSTER = reference_roster()  # the suites' reference agent ids (checkpoints.verl takes them as an argument)

TINY = Path(resolve_model("tiny-random"))  # resolved before any test points the cache elsewhere


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("DRMAS_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _leftovers(cache: Path) -> list[str]:
    base = cache / "checkpoints"
    return sorted(p.name for p in base.iterdir()) if base.is_dir() else []


def _plain_checkpoint(root: Path, wgs: dict[str, int], ws: int = 2) -> Path:
    """A reference root whose groups hold tiny-random split into ``ws`` plain-tensor shards along dim 0
    (the layout the reference's merger joins by concatenation), config beside them; values scaled per group."""
    sd = load_file(str(TINY / "model.safetensors"))
    step = root / "global_step_7"
    for wg, scale in wgs.items():
        folder = step / "actor" / wg
        folder.mkdir(parents=True)
        scaled = {k: v * scale for k, v in sd.items()}
        for r in range(ws):
            torch.save({k: v.chunk(ws, dim=0)[r].clone() for k, v in scaled.items()},
                       folder / f"model_world_size_{ws}_rank_{r}.pt")
        for f in TINY.iterdir():
            if f.is_file() and not f.name.endswith(".safetensors"):
                shutil.copyfile(f, folder / f.name)
    (root / "latest_checkpointed_iteration.txt").write_text("7")
    return root


# ------------------------------------------------------------------------------ agent ids


@pytest.mark.parametrize("wg, agents", [
    ("Qwen2.5-7B_Verifier Agent", ["Verifier Agent"]),
    ("Qwen2.5-7B_VerifierAgent_SearchAgent_AnswerAgent", ["Verifier Agent", "Search Agent", "Answer Agent"]),
    ("my_model_v2_SolverAgent_VerifierAgent", ["Solver Agent", "Verifier Agent"]),
    ("tiny-random_Solver Agent", ["Solver Agent"]),
    ("Qwen3-4B_Critic Agent", ["Critic Agent"]),
    ("Qwen3-4B_SolverAgent_CriticAgent_RefinerAgent_VerifierAgent",
     ["Solver Agent", "Critic Agent", "Refiner Agent", "Verifier Agent"]),
])
def test_worker_group_names_give_the_reference_agent_ids(wg, agents):
    assert agents_of(wg, ROSTER) == agents


@pytest.mark.parametrize("wg, named", [
    ("Qwen2.5-7B_Planner Agent", "Planner Agent"),
    ("Qwen2.5-7B_SolverAgent_PlannerAgent", "PlannerAgent"),
    ("Qwen2.5-7B_PlannerAgent_VerifierAgent_SearchAgent_AnswerAgent", "PlannerAgent"),  # first of the ids
    ("Qwen2.5-7B_VerifierAgent_PlannerAgent_SearchAgent_AnswerAgent", "PlannerAgent"),  # among them
    ("justamodel", "justamodel"),
])
def test_an_unknown_agent_id_is_one_line_naming_it_and_the_known_ones(wg, named):
    with pytest.raises(UserError) as e:
        agents_of(wg, ROSTER)
    msg = str(e.value)
    assert "\n" not in msg and f"agent id {named!r}" in msg
    assert "known: Answer Agent, Critic Agent, Refiner Agent, Search Agent, Solver Agent, Verifier Agent" in msg


def _named_groups(root: Path, names: list[str]) -> Path:
    for n in names:
        (root / "global_step_1" / "actor" / n).mkdir(parents=True)
        (root / "global_step_1" / "actor" / n / "model_world_size_1_rank_0.pt").write_bytes(b"")
    return root / "global_step_1"


def test_the_workflow_and_suite_follow_from_the_agents(tmp_path):
    t = read_team(_named_groups(tmp_path / "a", ["m_Solver Agent", "m_Verifier Agent"]), ROSTER)
    assert (t.workflow, t.suite, t.agents) == ("math_refine", "math", {"solver": "m_Solver Agent",
                                                                       "verifier": "m_Verifier Agent"})
    t = read_team(_named_groups(tmp_path / "b", ["m_VerifierAgent_SearchAgent_AnswerAgent"]), ROSTER)
    assert (t.workflow, t.suite) == ("search_route", "search") and set(t.agents) == {"verifier", "searcher", "answerer"}
    t = read_team(_named_groups(tmp_path / "c", ["m_Solver Agent"]), ROSTER)
    assert (t.workflow, t.suite) == ("math_single", "math")
    names = ["Qwen3-4B_Solver Agent", "Qwen3-4B_Critic Agent", "Qwen3-4B_Refiner Agent", "Qwen3-4B_Verifier Agent"]
    t = read_team(_named_groups(tmp_path / "f", names), ROSTER)  # the reference's 4-agent math team, one group each
    assert (t.workflow, t.suite) == ("math_4agent", "math")
    assert t.agents == dict(zip(("solver", "critic", "refiner", "verifier"), names))
    t = read_team(_named_groups(tmp_path / "g", ["Qwen3-4B_SolverAgent_CriticAgent_RefinerAgent_VerifierAgent"]), ROSTER)
    assert (t.workflow, t.suite) == ("math_4agent", "math") and len(set(t.agents.values())) == 1
    with pytest.raises(UserError, match="no workflow in suite search has exactly the agents Solver Agent, Verifier"):
        read_team(tmp_path / "a" / "global_step_1", ROSTER, suite="search")
    with pytest.raises(UserError, match="no workflow has exactly the agents Search Agent, Solver Agent"):
        read_team(_named_groups(tmp_path / "d", ["m_Solver Agent", "m_Search Agent"]), ROSTER)
    with pytest.raises(UserError, match="'Solver Agent' is in two worker groups"):
        read_team(_named_groups(tmp_path / "e", ["m_Solver Agent", "n_SolverAgent_VerifierAgent"]), ROSTER)


def test_the_root_resolves_to_the_step_its_tracker_names(tmp_path):
    root = tmp_path / "root"
    _named_groups(root, ["m_Solver Agent"])
    (root / "latest_checkpointed_iteration.txt").write_text("1\n")
    assert verl_ckpt.is_reference_checkpoint(root) and verl_ckpt.step_folder(root) == root / "global_step_1"
    (root / "latest_checkpointed_iteration.txt").write_text("9")
    with pytest.raises(UserError, match="names step 9, but .*global_step_9/actor does not exist"):
        verl_ckpt.step_folder(root)
    assert not verl_ckpt.is_reference_checkpoint(TINY)


# ------------------------------------------------------------------------------ merge of plain shards, cache


def test_plain_shards_merge_bit_for_bit_into_a_cached_team_folder(tmp_path, cache):
    root = _plain_checkpoint(tmp_path / "ck", {"tiny_Solver Agent": 1, "tiny_Verifier Agent": 3})
    folder, team = team_folder(root, ROSTER, show_progress=False)
    doc = yaml.safe_load((folder / "team.yaml").read_text())
    assert doc["workflow"] == "math_refine"
    assert doc["agents"] == {"solver": "tiny_Solver_Agent", "verifier": "tiny_Verifier_Agent"}
    orig = load_file(str(TINY / "model.safetensors"))
    for name, scale in (("tiny_Solver_Agent", 1), ("tiny_Verifier_Agent", 3)):
        got = load_file(str(folder / "models" / name / "model.safetensors"))
        assert set(got) == set(orig)
        assert all(got[k].dtype == orig[k].dtype and torch.equal(got[k], orig[k] * scale) for k in orig)
        assert (folder / "models" / name / "tokenizer.json").is_file()
    assert _leftovers(cache) == [folder.name]
    stamp = (folder / "team.yaml").stat().st_mtime_ns
    assert team_folder(root, ROSTER, show_progress=False)[0] == folder  # a second eval: found at once
    assert (folder / "team.yaml").stat().st_mtime_ns == stamp
    shard = root / "global_step_7" / "actor" / "tiny_Solver Agent" / "model_world_size_2_rank_1.pt"
    sd = torch.load(shard, weights_only=True)
    sd["model.norm.weight"] = sd["model.norm.weight"] + 1
    torch.save(sd, shard)
    again, _ = team_folder(root, ROSTER, show_progress=False)  # a changed shard merges again
    assert again != folder
    assert not torch.equal(load_file(str(again / "models/tiny_Solver_Agent/model.safetensors"))["model.norm.weight"],
                           orig["model.norm.weight"])


def test_two_evals_at_once_merge_once(tmp_path, cache, monkeypatch):
    root = _plain_checkpoint(tmp_path / "ck", {"tiny_SolverAgent_VerifierAgent": 1})
    calls, real = [], verl_merge.merge_group

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(verl_merge, "merge_group", counted)
    out: list = []
    threads = [threading.Thread(target=lambda: out.append(team_folder(root, ROSTER, show_progress=False)[0])) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(out) == 2 and out[0] == out[1]


def _refused(root: Path, cache: Path, *match: str) -> str:
    with pytest.raises(UserError) as e:
        team_folder(root, ROSTER, show_progress=False)
    msg = str(e.value)
    assert "\n" not in msg and all(m in msg for m in match), msg
    assert _leftovers(cache) == [], "a refused merge left something in the cache"
    return msg


def test_a_missing_rank_mixed_world_sizes_and_no_config_are_refused(tmp_path, cache):
    wg = tmp_path / "a" / "global_step_7" / "actor" / "t_Solver Agent"
    _plain_checkpoint(tmp_path / "a", {"t_Solver Agent": 1}, ws=3)
    (wg / "model_world_size_3_rank_1.pt").unlink()
    _refused(tmp_path / "a", cache, "world size 3 but the shard of rank 1 is missing")
    _plain_checkpoint(tmp_path / "b", {"t_Solver Agent": 1}, ws=2)
    wg = tmp_path / "b" / "global_step_7" / "actor" / "t_Solver Agent"
    shutil.copyfile(wg / "model_world_size_2_rank_0.pt", wg / "model_world_size_4_rank_0.pt")
    _refused(tmp_path / "b", cache, "mixed world sizes (2, 4)")
    (wg / "model_world_size_4_rank_0.pt").unlink()
    (wg / "config.json").unlink()
    _refused(tmp_path / "b", cache, "no huggingface/config.json")


def test_a_truncated_shard_is_refused(tmp_path, cache):
    _plain_checkpoint(tmp_path / "a", {"t_Solver Agent": 1, "t_Verifier Agent": 2})
    shard = tmp_path / "a" / "global_step_7" / "actor" / "t_Verifier Agent" / "model_world_size_2_rank_1.pt"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    _refused(tmp_path / "a", cache, "model_world_size_2_rank_1.pt: truncated or damaged shard")


class Planted:
    """An object whose unpickling would run code (it writes a file): never reached under the allowlist."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (Path(self.path).write_text, ("ran",))


def test_a_shard_naming_another_class_is_refused_and_nothing_from_it_runs(tmp_path, cache):
    import argparse

    _plain_checkpoint(tmp_path / "a", {"t_Solver Agent": 1})
    shard = tmp_path / "a" / "global_step_7" / "actor" / "t_Solver Agent" / "model_world_size_2_rank_0.pt"
    sd = torch.load(shard, weights_only=True)
    torch.save({**sd, "extra": argparse.Namespace(x=1)}, shard)
    _refused(tmp_path / "a", cache, "model_world_size_2_rank_0.pt: refused", "argparse.Namespace")
    flag = tmp_path / "ran.txt"
    torch.save({**sd, "extra": Planted(str(flag))}, shard)
    _refused(tmp_path / "a", cache, "refused", "nothing from it was run")
    assert not flag.exists()


def test_eval_refuses_an_unknown_agent_in_one_line(tmp_path, cache, capsys):
    _plain_checkpoint(tmp_path / "a", {"t_PlannerAgent_VerifierAgent_SearchAgent_AnswerAgent": 1})
    rc = main(["eval", "--model", str(tmp_path / "a"), "--limit", "1", "--n", "1", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "'PlannerAgent'" in err and "known: Answer Agent" in err
    assert not (tmp_path / "run").exists() and _leftovers(cache) == []


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


def test_eval_infers_the_suite_and_gives_each_agent_its_group(tmp_path, cache, monkeypatch):
    """plan() merges nothing (no folder, no lock in the cache): it carries the merge as a step, which
    the run (api.prepare) performs; the plan after it infers the suite and gives each agent its group."""
    from drmas_bench.api import plan
    from drmas_bench.needs import Pending
    from drmas_bench.preparation import perform

    root = _plain_checkpoint(tmp_path / "ck", {"tiny_Verifier Agent": 1, "tiny_SearchAgent_AnswerAgent": 2})
    cfg = EvalConfig(model=str(root / "global_step_7"), limit=1, n=1, out=str(tmp_path / "run"), progress=False)
    before = _files(cache)

    def no_merge(*a, **k):
        raise AssertionError("plan() merged")

    with monkeypatch.context() as m:
        m.setattr(verl_merge, "merge_group", no_merge)
        p = plan(cfg)
        assert isinstance(p, Pending) and _files(cache) == before and not (cache / "locks").exists()
        [step] = p.todo
        assert step.action == "merge reference checkpoint" and step.source == cfg.model
        assert step.dest.parent == cache / "checkpoints" and not step.dest.exists()
        shards = sum(f.stat().st_size for f in (root / "global_step_7").rglob("model_world_size_*.pt"))
        assert step.size_bytes == shards and step.dest.name in p.describe()
        with pytest.raises(UserError, match="not prepared yet .*models prepare"):
            resolve(cfg)  # resolve() is pure too: one line saying how to prepare it
    perform(p.todo, show_progress=False)
    assert _leftovers(cache) == [step.dest.name]
    r = resolve(cfg)
    assert r.suite == "search" and r.wf.name == "search_route" and r.checkpoint == str(step.dest)
    assert {a: r.team.agents[a] for a in ("verifier", "searcher", "answerer")} == {
        "verifier": "tiny_Verifier_Agent", "searcher": "tiny_SearchAgent_AnswerAgent",
        "answerer": "tiny_SearchAgent_AnswerAgent"}
    with pytest.raises(UserError, match="no workflow in suite math has exactly the agents"):
        plan(replace(cfg, model=str(root), suite="math"))


def test_models_prepare_merges_a_reference_checkpoint_ahead_of_eval(tmp_path, cache, capsys):
    """`models prepare ROOT --dry-run` says what would be merged and does nothing; without it the
    merge lands where eval looks for it; a name that is none of the three kinds is one line."""
    root = _plain_checkpoint(tmp_path / "ck", {"tiny_SolverAgent_VerifierAgent": 1})
    assert main(["models", "prepare", str(root), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"merge reference checkpoint {root} -> {cache / 'checkpoints'}") and "(to do, " in out
    assert _leftovers(cache) == [] and not (cache / "locks").exists()
    assert main(["models", "prepare", str(root), "--no-progress"]) == 0
    [name] = _leftovers(cache)
    assert (cache / "checkpoints" / name / "team.yaml").is_file() and name in out
    assert resolve(EvalConfig(model=str(root))).checkpoint == str(cache / "checkpoints" / name)
    assert main(["models", "prepare", str(root), "--dry-run"]) == 0
    assert "(in the cache)" in capsys.readouterr().out
    assert main(["models", "prepare", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a model alias" in err


def test_a_merge_cut_short_goes_on_with_the_groups_it_had_not_finished(tmp_path, cache, monkeypatch):
    """A merge interrupted after its first worker group keeps that group in the partial folder; the
    next attempt merges only the other one, and the team folder equals an uninterrupted merge's."""
    root = _plain_checkpoint(tmp_path / "ck", {"tiny_Solver Agent": 1, "tiny_Verifier Agent": 3})
    calls, real = [], verl_merge.merge_group

    def cut(*a, **k):
        calls.append(a[0].name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(verl_merge, "merge_group", cut)
    with pytest.raises(KeyboardInterrupt):
        team_folder(root, ROSTER, show_progress=False)
    assert _leftovers(cache) and all(n.startswith(".part-verl-") for n in _leftovers(cache))
    monkeypatch.setattr(verl_merge, "merge_group", lambda *a, **k: (calls.append(a[0].name), real(*a, **k))[1])
    folder, _ = team_folder(root, ROSTER, show_progress=False)
    assert calls == ["tiny_Solver Agent", "tiny_Verifier Agent", "tiny_Verifier Agent"]
    assert _leftovers(cache) == [folder.name] and not (folder / ".done").exists()
    orig = load_file(str(TINY / "model.safetensors"))
    for name, scale in (("tiny_Solver_Agent", 1), ("tiny_Verifier_Agent", 3)):
        got = load_file(str(folder / "models" / name / "model.safetensors"))
        assert all(torch.equal(got[k], orig[k] * scale) for k in orig)


@pytest.mark.slow
@pytest.mark.skipif(find_data_dir() is None, reason="benchmark files not found (DRMAS_DATA_DIR)")
def test_a_4agent_math_root_evaluates_with_the_suite_inferred(tmp_path, cache):
    """The reference's 4-agent team (one group per agent, spaces kept), evaluated with --model ROOT only."""
    groups = {f"tiny_{n} Agent": i for i, n in enumerate(("Solver", "Critic", "Refiner", "Verifier"), 1)}
    root = _plain_checkpoint(tmp_path / "ck", groups)
    rc = main(["eval", "--model", str(root), "--data-dir", str(find_data_dir()), "--limit", "1", "--n", "1",
               "--max-new-tokens", "4",
               "--temperature", "0", "--out", str(tmp_path / "run")])
    assert rc == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    run = summary["run"]
    assert run["suite"] == "math" and run["workflow"] == "math_4agent"
    assert {a: t["worker_group"] for a, t in run["team"].items()} == {
        a: f"tiny_{a.capitalize()}_Agent" for a in ("solver", "critic", "refiner", "verifier")}
    rows = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines() if x.strip()]
    assert rows and rows[0]["turns"][0]["agent"] == "solver"


# ------------------------------------------------------------------------------ real sharding (gloo, 2 processes)


@pytest.fixture(scope="session")
def sharded(tmp_path_factory) -> Path:
    from verl_fixtures import build

    return build(tmp_path_factory.mktemp("verl"))


def _names(folder: Path) -> dict[str, str]:
    """reference wg_id -> the team file's worker-group name."""
    return {v: k for k, v in json.loads((folder / "source.json").read_text())["groups"].items()}


@pytest.mark.slow
def test_real_fsdp_shards_merge_bit_for_bit_with_their_dtype(sharded, cache):
    from verl_fixtures import CASES

    for case, spec in CASES.items():
        folder, team = team_folder(sharded / case, ROSTER, show_progress=False)
        names = _names(folder)
        for wg_id, orig in spec["groups"].items():
            sub = folder / "models" / (names[wg_id] + (".base" if spec.get("lora") else ""))
            got = load_file(str(sub / "model.safetensors"))
            ref = load_file(str(sharded / "originals" / orig / "model.safetensors"))
            assert set(got) == set(ref), case
            assert (sub / "config.json").is_file() and not (sub / "fsdp_config.json").exists()
            for k in ref:
                assert got[k].dtype == ref[k].dtype and torch.equal(got[k], ref[k]), (case, wg_id, k)
            if spec.get("lora"):
                ad = folder / "models" / names[wg_id]
                src = team.step / "actor" / wg_id / "lora_adapter" / "adapter_model.safetensors"
                assert (ad / "adapter_model.safetensors").read_bytes() == src.read_bytes()
                cfg = json.loads((ad / "adapter_config.json").read_text())
                assert cfg["base_model_name_or_path"] == str(folder / "models" / (names[wg_id] + ".base"))


@pytest.mark.slow
def test_a_placement_the_merger_cannot_read_is_refused(sharded, tmp_path, cache):
    from torch.distributed.tensor import DTensor, Partial
    from torch.distributed.tensor._dtensor_spec import DTensorSpec

    root = tmp_path / "ck"
    shutil.copytree(sharded / "math_split", root)
    shard = root / "global_step_3" / "actor" / "tiny-random_Solver Agent" / "model_world_size_2_rank_0.pt"
    sd = torch.load(shard, weights_only=False)  # the test's own file
    k = "model.norm.weight"
    v = sd[k]
    spec = DTensorSpec(v._spec.mesh, (Partial(),), tensor_meta=v._spec.tensor_meta)
    sd[k] = DTensor(v._local_tensor, spec, requires_grad=False)
    torch.save(sd, shard)
    _refused(root, cache, f"{k}: placement", "cannot be merged (only Shard and Replicate)")


def _completions(run: Path) -> list[tuple]:
    rows = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines() if line.strip()]
    return sorted((r["task"]["benchmark"], r["task"]["id"], r["sample_idx"], i, t["agent"], t["completion"]["text"]
                   if isinstance(t["completion"], dict) else t["completion"]) for r in rows for i, t in enumerate(r["turns"]))


def _eval(tmp: Path, name: str, *args: str) -> list[tuple]:
    out = tmp / name
    rc = main(["eval", *args, "--limit", "2", "--n", "1", "--temperature", "0", "--max-new-tokens", "12",
               "--out", str(out), "--fresh"])
    assert rc == 0
    return _completions(out)


def _original_team(sharded: Path, case: str, tmp: Path, agents: dict[str, str], workflow: str) -> Path:
    """A team file pointing each agent at its original folder (``agents``: agent -> originals/<name>)."""
    team = {"workflow": workflow, "worker_groups": {n: {"model": str(sharded / "originals" / n)} for n in set(agents.values())},
            "agents": dict(agents)}
    path = tmp / f"{case}-team.yaml"
    path.write_text(yaml.safe_dump(team))
    return path


@pytest.mark.slow
@pytest.mark.skipif(find_data_dir() is None, reason="benchmark files not found (DRMAS_DATA_DIR)")
def test_eval_of_a_math_root_equals_eval_of_the_originals(sharded, tmp_path, cache):
    got = _eval(tmp_path, "ckpt", "--model", str(sharded / "math_split"))
    team = _original_team(sharded, "math", tmp_path, {"solver": "solver", "verifier": "verifier"}, "math_refine")
    want = _eval(tmp_path, "orig", "--team", str(team), "--suite", "math")
    assert got == want and any(c[-1] for c in got)
    swapped = _original_team(sharded, "swap", tmp_path, {"solver": "verifier", "verifier": "solver"}, "math_refine")
    assert _eval(tmp_path, "swap", "--team", str(swapped), "--suite", "math") != got  # the weights tell agents apart


@pytest.mark.slow
@pytest.mark.skipif(find_data_dir() is None, reason="benchmark files not found (DRMAS_DATA_DIR)")
def test_eval_of_a_search_step_equals_eval_of_the_originals(sharded, tmp_path, cache):
    got = _eval(tmp_path, "ckpt", "--model", str(sharded / "search_split" / "global_step_3"), "--suite", "search")
    team = _original_team(sharded, "search", tmp_path, {"verifier": "s_verifier", "searcher": "s_searcher",
                                                         "answerer": "s_answerer"}, "search_route")
    assert got == _eval(tmp_path, "orig", "--team", str(team), "--suite", "search")
    shared = _eval(tmp_path, "shared", "--model", str(sharded / "search_shared"))
    team = _original_team(sharded, "search1", tmp_path, {a: "shared_search" for a in ("verifier", "searcher", "answerer")},
                          "search_route")
    assert shared == _eval(tmp_path, "orig1", "--team", str(team), "--suite", "search")


@pytest.mark.slow
@pytest.mark.skipif(find_data_dir() is None, reason="benchmark files not found (DRMAS_DATA_DIR)")
def test_eval_of_a_lora_checkpoint_equals_base_plus_adapter(sharded, tmp_path, cache):
    got = _eval(tmp_path, "ckpt", "--model", str(sharded / "math_lora"))
    actor = sharded / "math_lora" / "global_step_3" / "actor"
    team = {"workflow": "math_refine",
            "worker_groups": {"s": {"model": str(actor / "tiny-random_Solver Agent" / "lora_adapter")},
                              "v": {"model": str(actor / "tiny-random_Verifier Agent" / "lora_adapter")}},
            "agents": {"solver": "s", "verifier": "v"}}
    (tmp_path / "lora-team.yaml").write_text(yaml.safe_dump(team))
    assert got == _eval(tmp_path, "orig", "--team", str(tmp_path / "lora-team.yaml"), "--suite", "math")
    assert got != _eval(tmp_path, "bases", "--model", str(sharded / "math_split"))  # same bases, no adapters


# ------------------------------------------------------------------------------ models export


def _same_tree(a: Path, b: Path, skip=()) -> None:
    fa = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file() and p.name not in skip)
    fb = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert fa == fb
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in fa)


def test_export_of_a_reference_checkpoint_round_trips(tmp_path, cache, capsys):
    root = _plain_checkpoint(tmp_path / "ck", {"tiny_Solver Agent": 1, "tiny_Verifier Agent": 2})
    assert main(["models", "export", str(root), "--out", str(tmp_path / "exp")]) == 0
    merged, _ = team_folder(root, ROSTER, show_progress=False)
    _same_tree(merged, tmp_path / "exp", skip=("source.json",))
    r = resolve(EvalConfig(model=str(tmp_path / "exp"), suite="math"))  # the export evaluates as the checkpoint does
    assert r.suite == "math" and r.team.agents == resolve(EvalConfig(model=str(root))).team.agents
    assert main(["models", "export", str(root), "--out", str(tmp_path / "exp")]) == 2  # never over an export
    assert "exists and is not empty" in capsys.readouterr().err


def test_export_of_our_checkpoint_leaves_the_optimiser_out(tmp_path, cache):
    step = tmp_path / "run" / "step_2"
    shutil.copytree(TINY, step / "models" / "g")
    (step / "optim").mkdir()
    torch.save({}, step / "optim" / "g.pt")
    (step / "trainer_state.json").write_text("{}")
    team = {"workflow": "toy", "worker_groups": {"g": {"model": "models/g"}}, "agents": {"solver": "g", "checker": "g"}}
    (step / "team.yaml").write_text(yaml.safe_dump(team))
    from drmas_bench.checkpoints.export import export

    with pytest.raises(UserError, match="an incomplete checkpoint"):
        export(str(step), tmp_path / "exp", ROSTER)
    assert not (tmp_path / "exp").exists()
    (step / "COMPLETE").write_text("step 2\n")
    assert main(["models", "export", str(step), "--out", str(tmp_path / "exp")]) == 0
    _same_tree(step / "models", tmp_path / "exp" / "models")
    assert not (tmp_path / "exp" / "optim").exists()
    assert yaml.safe_load((tmp_path / "exp" / "team.yaml").read_text()) == team


@pytest.mark.slow
@pytest.mark.skipif(find_data_dir() is None, reason="benchmark files not found (DRMAS_DATA_DIR)")
def test_an_exported_lora_checkpoint_evaluates_as_the_checkpoint(sharded, tmp_path, cache):
    assert main(["models", "export", str(sharded / "math_lora"), "--out", str(tmp_path / "exp")]) == 0
    shutil.rmtree(cache)  # the export stands alone: the merge cache is gone
    got = _eval(tmp_path, "exp-run", "--model", str(tmp_path / "exp"), "--suite", "math")
    assert got == _eval(tmp_path, "ckpt-run", "--model", str(sharded / "math_lora"))


# ------------------------------------------------------------------------------ verl's own merger as the oracle

_VERL_MERGE = """
import sys
from verl.model_merger.base_model_merger import ModelMergerConfig
from verl.model_merger.fsdp_model_merger import FSDPModelMerger
cfg = ModelMergerConfig(operation='merge', backend='fsdp', local_dir=sys.argv[1], hf_model_config_path=sys.argv[2],
                        target_dir=sys.argv[3])
FSDPModelMerger(cfg).merge_and_save()
"""


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("DRMAS_VERL_PYTHON"),
                    reason="DRMAS_VERL_PYTHON names no interpreter with the PyPI verl package (docs/eval.md)")
def test_verls_own_merger_reads_the_fixtures_to_the_same_weights(sharded, tmp_path, cache):
    """The PyPI verl package's FSDP merger (it casts every tensor to bfloat16) on the same shards:
    its weights equal ours cast to bfloat16, which shows the fixtures are the format verl reads."""
    import subprocess

    from verl_fixtures import CASES

    for case, spec in CASES.items():
        if spec.get("lora"):
            continue  # verl's merger writes the peft-wrapped names; the adapter path is tested above
        folder, team = team_folder(sharded / case, ROSTER, show_progress=False)
        names = _names(folder)
        for wg_id in spec["groups"]:
            src = tmp_path / "src" / case / wg_id  # verl's merger reads the world size from fsdp_config.json
            shutil.copytree(team.step / "actor" / wg_id, src)
            if not (src / "fsdp_config.json").is_file():
                (src / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": 2}))
            target = tmp_path / case / names[wg_id]
            subprocess.run([os.environ["DRMAS_VERL_PYTHON"], "-c", _VERL_MERGE, str(src),
                            str(verl_merge.config_source(src)), str(target)], check=True, capture_output=True)
            theirs = {}
            for f in sorted(target.glob("*.safetensors")):
                theirs.update(load_file(str(f)))
            ours = load_file(str(folder / "models" / names[wg_id] / "model.safetensors"))
            assert set(theirs) == set(ours), (case, set(theirs) ^ set(ours))
            for k in ours:
                assert torch.equal(theirs[k], ours[k].to(torch.bfloat16)), (case, wg_id, k)


@pytest.mark.parametrize("wg, name", [("Qwen2.5-7B_Verifier Agent", "Qwen2.5-7B_Verifier_Agent"),
                                      ("a...b_SolverAgent", "a.b_SolverAgent"), ("../x y", "x_y")])
def test_worker_group_names_become_safe_file_names(wg, name):
    from drmas_bench.files import safe_name

    assert verl_ckpt.group_name(wg, set()) == name == safe_name(name, "wg")
    assert verl_ckpt.group_name(wg, {name}) == f"{name}-2"
