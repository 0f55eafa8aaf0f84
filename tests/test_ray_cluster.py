"""A real two-node Ray cluster on this machine (``ray.cluster_utils.Cluster``): a head node and a
worker node with one logical GPU each, each with its own CPUs, custom resource and temp dir.
The driver *attaches* to it by address, as a user would with ``--ray-address``: the code is shipped
in the runtime_env, models are resolved inside the actors, checkpoints go to the named root.

- eval (search suite, three worker groups verifier / searcher / answerer on tiny-random, two GPUs):
  the actors that run at once land on both nodes;
- a model folder missing on the node that loads it: a one-line error naming that node;
- train: two steps on a micro tiny recipe with one worker group per node (the shipped code on the
  workers' path), the checkpoint written by both nodes into ``ckpt_root`` and checked complete.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from drmas_bench.pool.cluster import driver_model_name, init_kwargs, ray_address, should_ship, stage_packages
from drmas_bench.types import UserError

HERE = Path(__file__).parent


def test_address_from_flag_then_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert ray_address(None) is None
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert ray_address(None) == "10.0.0.1:6379" and ray_address("auto") == "auto"
    assert should_ship("auto", None) and not should_ship(None, None) and should_ship(None, True)
    kw = init_kwargs("10.0.0.1:6379", stage_packages(tmp_path), num_cpus=4)  # attaching: local options dropped
    assert kw["address"] == "10.0.0.1:6379" and "num_cpus" not in kw
    shipped = kw["runtime_env"]["py_modules"]
    assert sorted(Path(p).name for p in shipped)[:2] == ["drmas_bench", "drmas_retrieval"]
    assert all((Path(p) / "__init__.py").is_file() and not list(Path(p).rglob("__pycache__")) for p in shipped)
    local = init_kwargs(None, num_cpus=2, num_gpus=None)
    assert "py_modules" not in local["runtime_env"] and local["num_cpus"] == 2 and "num_gpus" not in local
    assert local["address"] == "local"  # a new Ray here, not the latest `ray start` cluster of this machine


def test_unreachable_cluster_is_one_line(monkeypatch):
    import socket

    from drmas_bench.pool.cluster import check_reachable

    with socket.socket() as s:  # a free loopback port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(UserError, match=f"cannot reach the Ray cluster at 127.0.0.1:{port}"):
        check_reachable(f"127.0.0.1:{port}", timeout_s=2)
    check_reachable("auto")  # left to Ray


def test_driver_makes_its_relative_folders_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m").mkdir()
    assert driver_model_name("m") == str(tmp_path / "m")
    assert driver_model_name("tiny-random") == "tiny-random"  # alias: prepared on the node
    assert driver_model_name("org/not-here") == "org/not-here"  # hub id / node-local folder: as written


def test_ckpt_root_resolution_and_group_check(tmp_path, monkeypatch):
    from drmas_trainer import checkpoint as ck

    monkeypatch.chdir(tmp_path)
    assert ck.resolve_root(tmp_path / "run", None) == tmp_path / "run" / "ckpt"
    assert ck.resolve_root(tmp_path / "run", "shared/ck") == tmp_path / "shared" / "ck"
    assert ck.resolve_root(tmp_path / "run", "file:///shared/ck/") == "file:///shared/ck"  # a URL: drmas_bench.checkpoints.layout
    with pytest.raises(UserError, match="fsspec knows no zzq:// filesystem"):
        ck.resolve_root(tmp_path, "zzq://bucket/ck")
    tmp = ck.begin(tmp_path / "ck", 1)
    (tmp / "models" / "a").mkdir()
    (tmp / "models" / "a" / "config.json").write_text("{}")
    (tmp / "models" / "a" / "model.safetensors").write_bytes(b"x")
    (tmp / "optim" / "a.pt").write_bytes(b"x")
    assert ck.missing_groups(tmp, ["a", "b"]) == ["b"]


def test_driver_refuses_a_checkpoint_whose_group_wrote_elsewhere(tmp_path):
    """Orchestration only, with a *fake* worker group standing in for an actor on another node whose
    ``save`` wrote to that node's local disk: nothing reaches the root, so no checkpoint is marked."""
    import asyncio

    from drmas_trainer import checkpoint as ck
    from drmas_trainer.config.train import load_config
    from drmas_trainer.config.groups import plan_worker_groups
    from drmas_trainer.saving import save_checkpoint
    from drmas_bench.workflows.base import get_workflow

    class FakeRemoteWorker:
        async def save(self, folder: str, optimizer_path: str | None = None) -> None:
            return None  # written "on the other node": absent here

    cfg = load_config("tiny", {"ckpt_root": str(tmp_path / "root")})
    wf = get_workflow(cfg.workflow)
    plan = plan_worker_groups(cfg, wf.agents)
    with pytest.raises(UserError, match=r"worker group\(s\) .*checker.* are not in .*root.*ckpt_root"):
        asyncio.run(save_checkpoint(tmp_path / "run", cfg, plan, {n: FakeRemoteWorker() for n in plan}, wf,
                                    step=1, cursor=0, skipped_total=0))
    assert ck.latest_checkpoint(tmp_path / "root") is None and not (tmp_path / "run" / "ckpt").exists()


ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from ray.cluster_utils import Cluster

    if ray.is_initialized():  # pragma: no cover - another module left one running
        ray.shutdown()
    base = tmp_path_factory.mktemp("ray")
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "num_gpus": 1, "resources": {"node_a": 1}, "temp_dir": str(base / "a"),
        "include_dashboard": False})
    b = c.add_node(num_cpus=1, num_gpus=1, resources={"node_b": 1}, temp_dir=str(base / "b"))
    c.wait_for_nodes()
    c.labels = {c.head_node.node_id: "node_a", b.node_id: "node_b"}
    yield c
    if ray.is_initialized():
        ray.shutdown()
    c.shutdown()


def _labels(cluster, placed: list[dict]) -> set[str]:
    """The custom resources (node_a / node_b) of the nodes named in ``placed[i]["node"]`` (node_label)."""
    short = {p["node"].split("id ")[1] for p in placed}
    return {label for node_id, label in cluster.labels.items() if node_id[:8] in short}





@pytest.mark.slow
def test_eval_attaches_and_spreads_three_groups_over_two_nodes(cluster, tmp_path, monkeypatch):
    from drmas_bench.api import EvalConfig, evaluate
    from drmas_retrieval import build_index

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    data = tmp_path / "data" / "qa" / "bamboogle"
    data.mkdir(parents=True)
    rows = [{"id": f"q{i}", "question": f"Where is the Amber Lighthouse {i}?", "golden_answers": ["Kelmouth"]} for i in range(2)]
    (data / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    build_index("bm25", HERE / "data" / "retrieval_corpus.jsonl", tmp_path / "idx")
    agents = ("verifier", "searcher", "answerer")
    team = tmp_path / "team.yaml"  # one worker group per agent
    team.write_text(json.dumps({"workflow": "search_route", "worker_groups": {a: "tiny-random" for a in agents},
                                "agents": {a: a for a in agents}}))
    s = evaluate(EvalConfig(team=str(team), suite="search", benchmarks=["bamboogle"], n=1, max_new_tokens=4,
                            data_dir=str(tmp_path / "data"), retriever=f"bm25:{tmp_path / 'idx'}",
                            engine_args={"device": "cpu"}, pool="ray", ray_address=cluster.address,
                            out=str(tmp_path / "run"), progress=False))
    assert not ray.is_initialized()  # the pool attached, so it detached at the end; the cluster lives on
    groups = s["pool"]["groups"]
    assert sorted(groups) == ["answerer", "searcher", "verifier"]
    actors = [a for g in groups.values() for a in g["actors"]]
    # verifier and answerer run in every episode and stay awake together: one GPU each, one per node
    assert len(actors) >= 2 and all(a["gpu_ids"] for a in actors)
    assert _labels(cluster, actors) == {"node_a", "node_b"}
    assert sum(1 for _ in open(tmp_path / "run" / "samples.jsonl")) == 2


@pytest.mark.slow
def test_missing_model_folder_names_the_node(cluster, tmp_path):
    """eval of a model folder the nodes lack: the driver does not resolve it (it may be node-local),
    the actor does, and its one-line error names the node."""
    from drmas_bench.api import EvalConfig, evaluate

    missing = tmp_path / "not-on-the-nodes"
    with pytest.raises(UserError) as e:
        evaluate(EvalConfig(model=str(missing), suite="toy", limit=1, n=1, engine_args={"device": "cpu"}, pool="ray",
                            ray_address=cluster.address, out=str(tmp_path / "run"), progress=False))
    msg = str(e.value)
    assert "\n" not in msg and str(missing) in msg
    assert re.search(r"on Ray node [0-9.]+, id [0-9a-f]{8}", msg), msg
    assert not ray.is_initialized()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["folder", "file-url"])
def test_train_two_steps_one_group_per_node_checkpoint_in_root(cluster, tmp_path, kind, monkeypatch):
    """``folder``: a shared folder; ``file-url``: the same folder named as an fsspec URL, so each
    actor saves into a staging folder on its node and uploads through fsspec (drmas_bench.checkpoints.layout), and a
    ``--resume`` from it has each actor download its own part."""
    from drmas_trainer import checkpoint as ck
    from drmas_trainer.config.train import load_config, parse_override
    from drmas_trainer.trainer import train

    def shipped_on_path() -> list[str]:  # runs on a worker (nested: pickled by value)
        import os
        import sys

        return [p for p in sys.path if "runtime_resources" in p and os.path.isdir(os.path.join(p, "drmas_bench"))]

    root = tmp_path / "shared-ckpt"
    named = root.as_uri() if kind == "file-url" else str(root)
    sets = ["sft.steps=1", "sft.batch_size=4", "rollout.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=4",
            "steps=2", "save_every=1", f"ckpt_root={named}", f"ray.address={cluster.address}", "ray.timeout_s=30",
            "val.before_train=false", "val.every=0"]
    cfg = load_config("tiny", dict(parse_override(x) for x in sets))
    ray.init(**init_kwargs(cluster.address, stage_packages(tmp_path / "ship")))  # as train attaches, done first
    try:
        shipped = ray.get(ray.remote(num_cpus=0, resources={"node_b": 0.01})(shipped_on_path).remote())
        summary = train(cfg, tmp_path / "run", use_ray=True, progress=False)  # two groups x 1 GPU: one per node
    finally:
        ray.shutdown()
    assert shipped, "the shipped packages should be on node_b's worker path"
    assert summary["steps"] == 2
    workers = json.loads((tmp_path / "run" / "workers.json").read_text())["worker_groups"]
    assert _labels(cluster, workers) == {"node_a", "node_b"}
    assert not (tmp_path / "run" / "ckpt").exists()  # everything went to the named root
    step, folder = ck.latest_checkpoint(root)
    assert step == 2 and ck.missing_groups(folder, ["solver", "checker"]) == []
    assert (folder / "team.yaml").is_file()  # eval --model ROOT/step_2 reads the trained team from the root
    if kind == "folder":
        assert (root / "latest").is_symlink() and (root / "latest").resolve().name == "step_2"
        return
    assert (root / "latest").read_text() == "step_2\n"  # a URL root: a text file naming the step
    # --resume from the URL: the driver downloads its own files, each actor its group's part on its node
    monkeypatch.setenv("DRMAS_CACHE_DIR", str(tmp_path / "node-cache"))  # shipped to the actors' env
    cfg3 = load_config("tiny", dict(parse_override(x) for x in sets + ["steps=3"]))
    ray.init(**init_kwargs(cluster.address, stage_packages(tmp_path / "ship")))
    try:
        assert train(cfg3, tmp_path / "run", resume=True, use_ray=True, progress=False)["steps"] == 3
    finally:
        ray.shutdown()
    assert sorted(p.name for p in (tmp_path / "run" / ".ckpt-cache" / "step_2").iterdir()) == \
        ["COMPLETE", "rng.pt", "team.yaml", "trainer_state.json"]
    parts = sorted(p.name for d in (tmp_path / "node-cache" / "checkpoints" / "parts").iterdir() for p in d.iterdir())
    assert parts == ["checker", "checker.pt", "solver", "solver.pt"]
    assert ck.latest_checkpoint(root)[0] == 3 and (root / "latest").read_text() == "step_3\n"

    # eval --model URL/latest --pool ray: the driver fetches the team file only, each actor its model
    from drmas_bench.api import EvalConfig, evaluate

    monkeypatch.setenv("DRMAS_CACHE_DIR", str(tmp_path / "eval-cache"))
    s = evaluate(EvalConfig(model=f"{named}/latest", suite="toy", limit=2, n=1, engine_args={"device": "cpu"},
                            pool="ray", ray_address=cluster.address, out=str(tmp_path / "eval"), progress=False))
    assert sum(1 for _ in open(tmp_path / "eval" / "samples.jsonl")) == 2 and s["pool"]["groups"]
    cache = tmp_path / "eval-cache" / "checkpoints"
    driver_copy = [d for d in cache.iterdir() if d.is_dir() and d.name != "models"]
    assert len(driver_copy) == 1 and not (driver_copy[0] / "models").exists()  # no weights on the driver
    fetched = sorted(p.name for d in (cache / "models").iterdir() if d.is_dir() for p in d.iterdir())
    assert "config.json" in fetched and any(n.endswith(".safetensors") for n in fetched)  # by the actors
    cfg_yaml = (tmp_path / "eval" / "config.yaml").read_text()
    assert f"{named}/step_3/models/solver" in cfg_yaml and "the Ray nodes" in cfg_yaml
