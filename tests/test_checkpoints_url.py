"""Checkpoints under an fsspec URL root (drmas_bench.checkpoints.layout), with real fsspec backends:
``memory://`` (one process) for the layout rules, ``file://`` (LocalFileSystem, what several
processes see) for a real training run, its resume and the eval of ``ROOT/latest``.

- layout: temp folder, move, marker last, ``latest`` text file; a step without the marker is ignored
  and cleaned; prune; ``--fresh`` clears only checkpoint entries;
- downloads: complete checkpoints only, the eval cache reused until the remote marker changes;
- the driver refuses a checkpoint whose group's upload is missing (previous one kept);
- a scheme fsspec does not know / a backend package that is missing: one line, before
  ``train --fresh`` deletes anything;
- slow: 2 steps of a micro tiny recipe into ``file://ROOT``, ``--resume`` to step 3 from it, and
  ``eval --model ROOT/latest``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import uuid
from pathlib import Path

import fsspec
import pytest

from drmas_bench.types import UserError
from drmas_trainer import checkpoint as ck
from drmas_bench.checkpoints import copies as checkpoint_copies
from drmas_bench.checkpoints import layout as checkpoints


@pytest.fixture
def mem_root() -> str:
    """A fresh memory:// root (the memory filesystem is global to the process)."""
    root = f"memory://ckpt-test-{uuid.uuid4().hex[:8]}/run1"
    yield root
    fs, path = fsspec.core.url_to_fs(root)
    if fs.exists(path):
        fs.rm(path, recursive=True)


def _put(url: str, data: bytes = b"x") -> None:
    with fsspec.open(url, "wb") as f:
        f.write(data)


def _group(tmp: str, name: str) -> None:
    """What a worker group's upload leaves (stand-in bytes; the layout is what is checked)."""
    for part in (f"models/{name}/config.json", f"models/{name}/model.safetensors", f"optim/{name}.pt"):
        _put(f"{tmp}/{part}")


def _commit(root: str, step: int, groups=("a",)) -> str:
    tmp = ck.begin(root, step)
    for g in groups:
        _group(tmp, g)
    with ck.driver_files(tmp) as here:
        (here / "trainer_state.json").write_text(json.dumps({"step": step}))
        (here / "team.yaml").write_text("agents: {}\n")
    return ck.commit(tmp, root, step)


def _read(url: str) -> bytes:
    with fsspec.open(url, "rb") as f:
        return f.read()


def test_url_layout_marker_last_latest_file_partial_ignored_prune_and_clear(mem_root):
    root = ck.resolve_root(Path("/unused"), mem_root + "/")
    assert root == mem_root
    tmp = ck.begin(root, 1)
    assert tmp.startswith(mem_root + "/.tmp-step_1-")
    _group(tmp, "a")
    assert ck.missing_groups(tmp, ["a", "b"]) == ["b"]  # checked through fsspec
    with ck.driver_files(tmp) as here:
        (here / "team.yaml").write_text("workflow: toy\n")
    final = ck.commit(tmp, root, 1)
    assert final == f"{mem_root}/step_1" and ck.latest_checkpoint(root) == (1, final)
    assert _read(f"{final}/team.yaml") == b"workflow: toy\n" and ck.missing_groups(final, ["a"]) == []
    assert _read(f"{mem_root}/latest") == b"step_1\n" and _read(f"{final}/COMPLETE").startswith(b"step 1\n")
    fs, path = fsspec.core.url_to_fs(mem_root)
    assert not any(p.rsplit("/", 1)[-1].startswith(".tmp-") for p in fs.ls(path, detail=False))

    # a kill while writing step 2 (temp folder) and a step folder without its marker: never used
    tmp2 = ck.begin(root, 2)
    _group(tmp2, "a")
    _put(f"{mem_root}/step_3/models/a/config.json")
    assert ck.latest_checkpoint(root)[0] == 1
    assert set(ck.clean_partial(root)) == {tmp2, f"{mem_root}/step_3"}
    assert ck.latest_checkpoint(root)[0] == 1 and not fs.exists(f"{path}/step_3")

    # a re-written step replaces the old one; prune keeps the newest and step 0
    for k in (0, 2, 3, 4):
        _commit(root, k)
    assert ck.prune(root, keep_last=2) == [f"{mem_root}/step_1", f"{mem_root}/step_2"]
    assert [s for s, _ in ck.complete_checkpoints(root)] == [0, 3, 4]
    assert _read(f"{mem_root}/latest") == b"step_4\n"

    # --fresh: checkpoint entries go, anything else in the root stays
    _put(f"{mem_root}/notes.txt", b"mine")
    ck.clear(root)
    assert ck.latest_checkpoint(root) is None and fs.ls(path, detail=False) == [f"{path}/notes.txt"]


def test_fetch_complete_only_and_eval_cache_follows_the_remote_marker(mem_root, tmp_path, monkeypatch):
    monkeypatch.setenv("DRMAS_CACHE_DIR", str(tmp_path / "cache"))
    final = _commit(mem_root, 1, groups=("a", "b"))
    got = checkpoint_copies.cached_checkpoint(f"{mem_root}/latest")  # latest -> step_1
    assert got.parent == tmp_path / "cache" / "checkpoints"
    assert (got / "models" / "b" / "config.json").is_file()
    assert not (got / "optim").exists()  # eval does not read optimiser state: not downloaded
    assert json.loads((got / "trainer_state.json").read_text()) == {"step": 1}
    assert (got / "COMPLETE").read_bytes() == _read(f"{final}/COMPLETE")
    (got / "mine").write_text("kept while the remote is unchanged")
    assert checkpoint_copies.cached_checkpoint(f"{mem_root}/step_1") == got and (got / "mine").is_file()
    # the root reused (--fresh, then a new step_1): a new marker id, downloaded again
    ck.clear(mem_root)
    _commit(mem_root, 1, groups=("a",))
    again = checkpoint_copies.cached_checkpoint(f"{mem_root}/step_1")
    assert again == got and not (again / "mine").exists() and not (again / "models" / "b").exists()
    # only complete checkpoints are downloaded; nothing is left behind
    _put(f"{mem_root}/step_2/models/a/config.json")
    with pytest.raises(UserError, match="step_2: not a complete checkpoint"):
        checkpoint_copies.cached_checkpoint(f"{mem_root}/step_2")
    assert sorted(p.name for p in (tmp_path / "cache" / "checkpoints").iterdir()) == [got.name]
    # an object key that would climb out of the download folder (untrusted data): refused, nothing kept
    _put(f"{mem_root}/step_1/models/a/../../../../evil")
    with pytest.raises(UserError, match=r"refusing to download 'models/a/\.\./\.\./\.\./\.\./evil'"):
        checkpoints.fetch(f"{mem_root}/step_1", tmp_path / "dl")
    assert not list(tmp_path.glob("**/evil")) and not list(tmp_path.glob(".tmp-*"))
    fs, path = fsspec.core.url_to_fs(mem_root)
    fs.rm(f"{path}/step_1/models/a/../../../../evil")
    # a worker group's part, downloaded on "its node"
    part = checkpoint_copies.node_copy(f"{mem_root}/step_1/models/a")
    assert part.name == "a" and (part / "model.safetensors").read_bytes() == b"x"


def test_driver_refuses_a_url_checkpoint_whose_group_upload_is_missing(mem_root, tmp_path):
    """Orchestration only: *fake* worker groups; one uploads its part, the other's upload never
    arrives. No marker, the previous checkpoint and ``latest`` are kept."""
    from drmas_bench.workflows.base import get_workflow
    from drmas_trainer.config.train import load_config
    from drmas_trainer.config.groups import plan_worker_groups
    from drmas_trainer.saving import save_checkpoint

    class FakeUploadingWorker:
        def __init__(self, name: str, arrives: bool) -> None:
            self.name, self.arrives = name, arrives

        async def save(self, folder: str, optimizer_path: str | None = None) -> None:
            if self.arrives:
                _put(f"{folder}/config.json")
                _put(f"{folder}/model.safetensors")
                _put(optimizer_path)

    cfg = load_config("tiny", {"ckpt_root": mem_root})
    wf = get_workflow(cfg.workflow)
    plan = plan_worker_groups(cfg, wf.agents)
    _commit(mem_root, 1, groups=tuple(plan))
    workers = {n: FakeUploadingWorker(n, arrives=(n == "solver")) for n in plan}
    with pytest.raises(UserError, match=r"step 2: .*worker group\(s\) checker are not in memory://.*as fsspec lists it"):
        asyncio.run(save_checkpoint(tmp_path / "run", cfg, plan, workers, wf, step=2, cursor=0, skipped_total=0))
    assert ck.latest_checkpoint(mem_root)[0] == 1 and _read(f"{mem_root}/latest") == b"step_1\n"
    assert not (tmp_path / "run" / "ckpt").exists()
    # with both uploads there, the same call commits step 2 with the driver's files
    workers["checker"].arrives = True
    final = asyncio.run(save_checkpoint(tmp_path / "run", cfg, plan, workers, wf, step=2, cursor=4, skipped_total=0))
    assert ck.latest_checkpoint(mem_root) == (2, final) and _read(f"{mem_root}/latest") == b"step_2\n"
    assert json.loads(_read(f"{final}/trainer_state.json"))["cursor"] == 4 and b"models/solver" in _read(f"{final}/team.yaml")


def test_unknown_scheme_or_missing_backend_is_one_line(tmp_path):
    with pytest.raises(UserError, match=r"^ckpt_root 'zzq://b/ck': fsspec knows no zzq:// filesystem") as e:
        ck.resolve_root(tmp_path, "zzq://b/ck")
    assert "\n" not in str(e.value)
    if importlib.util.find_spec("s3fs") is None:
        with pytest.raises(UserError, match=r"the s3:// filesystem needs the s3fs package \(pip install s3fs\)"):
            ck.resolve_root(tmp_path, "s3://bucket/ck")
    with pytest.raises(UserError, match="no such file; the root holds no finished checkpoint"):
        checkpoint_copies.cached_checkpoint(f"memory://nothing-{uuid.uuid4().hex[:6]}/latest")
    assert ck.resolve_root(tmp_path / "run", None) == tmp_path / "run" / "ckpt"  # local roots unchanged
    # train --fresh with such a root: refused before the old run is touched
    from drmas_trainer.config.train import load_config
    from drmas_trainer.trainer import train

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(UserError, match="fsspec knows no zzq://"):
        train(load_config("tiny", {"ckpt_root": "zzq://b/ck"}), tmp_path / "run", fresh=True, use_ray=False, progress=False)
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == '{"step": 1}\n'


MICRO = ["sft.steps=0", "rollout.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=4", "data.size=40",
         "agent_defaults.micro_batch_size=16", "save_every=1", "val.before_train=false", "val.every=0"]


@pytest.mark.slow
def test_train_into_file_url_resume_from_it_and_eval_latest(tmp_path, monkeypatch):
    from drmas_bench.api import EvalConfig, evaluate
    from drmas_trainer.config.train import load_config, parse_override
    from drmas_trainer.trainer import train

    root_dir = tmp_path / "bucket" / "run1"
    url = root_dir.as_uri()  # file:///...: a real fsspec backend every process on the machine sees
    run = tmp_path / "run"

    def cfg(steps: int):
        return load_config("tiny", dict(parse_override(s) for s in MICRO + [f"steps={steps}", f"ckpt_root={url}"]))

    assert train(cfg(2), run, use_ray=False, progress=False)["steps"] == 2
    assert not (run / "ckpt").exists()
    assert sorted(p.name for p in root_dir.iterdir()) == ["latest", "step_0", "step_1", "step_2"]
    assert (root_dir / "latest").read_text() == "step_2\n" and not (root_dir / "latest").is_symlink()
    assert all((root_dir / f"step_{k}" / "COMPLETE").is_file() for k in (0, 1, 2))
    assert ck.missing_groups(f"{url}/step_2", ["solver", "checker"]) == []
    with pytest.raises(UserError, match="--resume"):  # a second start without --resume
        train(cfg(2), run, use_ray=False, progress=False)

    # --resume from the URL root: downloads step_2 into RUN/.ckpt-cache and continues at step 3
    summary = train(cfg(3), run, resume=True, use_ray=False, progress=False)
    assert summary["steps"] == 3
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == [1, 2, 3] and recs[2]["data_cursor"] == 4
    assert (run / ".ckpt-cache" / "step_2" / "COMPLETE").is_file()
    assert (root_dir / "latest").read_text() == "step_3\n"
    assert json.loads((root_dir / "step_3" / "trainer_state.json").read_text())["cursor"] == 6
    assert json.loads((root_dir / "step_3" / "trainer_state.json").read_text())["step"] == 3

    # eval --model URL/latest: a complete local copy under the drmas cache dir, evaluated as a folder
    monkeypatch.setenv("DRMAS_CACHE_DIR", str(tmp_path / "cache"))
    s = evaluate(EvalConfig(model=f"{url}/latest", suite="toy", limit=2, n=1, out=str(tmp_path / "eval"),
                            concurrency=4, max_batch=4, progress=False))
    copy = next((tmp_path / "cache" / "checkpoints").iterdir())
    assert (copy / "COMPLETE").read_bytes() == (root_dir / "step_3" / "COMPLETE").read_bytes()
    assert "solver" in s.markdown and json.loads((tmp_path / "eval" / "summary.json").read_text())
    cfg_yaml = (tmp_path / "eval" / "config.yaml").read_text()
    assert str(copy / "models" / "solver") in cfg_yaml and str(copy / "models" / "checker") in cfg_yaml


def test_a_planted_ckpt_cache_symlink_is_refused(tmp_path):
    """RUN/.ckpt-cache (where a resume from a URL downloads) must not lead outside the run dir."""
    from drmas_trainer.config.train import load_config
    from drmas_trainer.trainer import train

    (tmp_path / "run").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "run" / ".ckpt-cache").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UserError, match="outside the run directory"):
        train(load_config("tiny", {"ckpt_root": f"memory://x-{uuid.uuid4().hex[:6]}"}), tmp_path / "run",
              resume=True, use_ray=False, progress=False)


def test_eval_downloads_of_one_checkpoint_take_turns(mem_root, tmp_path, monkeypatch):
    """Two evals of the same URL at once: the second waits for the first's download (a lock per
    checkpoint in the cache), then reuses it instead of replacing the folder the first is reading."""
    import threading

    from drmas_retrieval.locks import file_lock

    monkeypatch.setenv("DRMAS_CACHE_DIR", str(tmp_path / "cache"))
    _commit(mem_root, 1, groups=("a",))
    first = checkpoint_copies.cached_checkpoint(f"{mem_root}/step_1")
    inode = first.stat().st_ino
    done: list[Path] = []
    lock = tmp_path / "cache" / "locks" / f"checkpoint-{first.name}.lock"
    with file_lock(lock):  # another process downloading this checkpoint right now
        t = threading.Thread(target=lambda: done.append(checkpoint_copies.cached_checkpoint(f"{mem_root}/latest")))
        t.start()
        t.join(0.5)
        assert t.is_alive() and not done  # waits its turn
    t.join(10)
    assert done == [first] and first.stat().st_ino == inode  # reused, not replaced


def test_a_node_fetches_one_model_folder_by_url(mem_root, tmp_path, monkeypatch):
    """What a Ray actor does with ROOT/step_K/models/<wg>: a copy in its node's cache, reused while the
    step's marker holds; a step without its marker is refused; models.resolve_model takes that path."""
    from drmas_bench.agents.explicit import models_on_nodes
    from drmas_bench.agents.team import WorkerGroupSpec
    from drmas_bench.models import resolve_model

    monkeypatch.setenv("DRMAS_CACHE_DIR", str(tmp_path / "cache"))
    _commit(mem_root, 1, groups=("a", "b"))
    got = resolve_model(f"{mem_root}/step_1/models/a")
    assert (got / "config.json").is_file() and got.parent == tmp_path / "cache" / "checkpoints" / "models"
    assert [d for d in got.parent.iterdir() if d.is_dir()] == [got]  # only the group asked for, not b
    inode = got.stat().st_ino
    assert checkpoint_copies.cached_model(f"{mem_root}/step_1/models/a/") == got and got.stat().st_ino == inode  # reused
    _put(f"{mem_root}/step_2/models/a/config.json")
    with pytest.raises(UserError, match="step_2: not a complete checkpoint"):
        resolve_model(f"{mem_root}/step_2/models/a")

    groups = {"a": WorkerGroupSpec("a", "models/a"), "up": WorkerGroupSpec("up", "../elsewhere"),
              "abs": WorkerGroupSpec("abs", "/opt/m"), "api": WorkerGroupSpec("api", "gpt-x", engine="openai")}
    moved = models_on_nodes(groups, f"{mem_root}/step_1")
    assert groups["a"].model == "models/a"  # a new set of groups; the given ones are left as they were
    assert [g.model for g in moved.values()] == [f"{mem_root}/step_1/models/a", "../elsewhere", "/opt/m", "gpt-x"]


# ------------------------------------------------------------------------------ plan, then prepare


def _toy_checkpoint(root: Path) -> str:
    """A complete checkpoint of the toy team (tiny-random per group) under a file:// root, as the
    trainer leaves it: ROOT/step_1/{team.yaml, trainer_state.json, models/<wg>, optim/}, COMPLETE, latest."""
    import shutil

    from drmas_bench.models import resolve_model

    tiny = Path(resolve_model("tiny-random"))
    step = root / "step_1"
    for wg in ("solver", "checker"):
        shutil.copytree(tiny, step / "models" / wg)
    (step / "optim").mkdir()
    (step / "optim" / "solver.pt").write_bytes(b"not read by eval")
    (step / "team.yaml").write_text("worker_groups:\n  solver: {model: models/solver}\n  checker: {model: models/checker}\n"
                                    "agents: {solver: solver, checker: checker}\n")
    (step / "trainer_state.json").write_text(json.dumps({"step": 1}))
    (step / "COMPLETE").write_text("step 1\nid abc\n")
    (root / "latest").write_text("step_1\n")
    return root.as_uri()


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


def _clockless(d):
    """A summary block without its clock fields (latencies)."""
    if isinstance(d, dict):
        return {k: _clockless(v) for k, v in d.items() if "latency" not in k}
    return d


def _episodes(run: Path) -> list:
    rows = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    return sorted((r["task"]["id"], r["sample_idx"], r["final_answer"], r["reward"],
                   [t["completion"]["text"] for t in r["turns"]]) for r in rows)


def test_a_plan_of_a_url_checkpoint_downloads_nothing_and_the_run_fetches_it(tmp_path, monkeypatch, capsys):
    """plan() of `--model URL/latest` reads the pointer and the marker, writes nothing (no folder, no
    lock in the cache) and carries the fetch: source, destination, size. evaluate() fetches it (the
    optimiser state left out) and its episodes equal those of the same checkpoint as a local folder."""
    from drmas_bench.api import EvalConfig, evaluate, plan
    from drmas_bench.cli import main
    from drmas_bench.needs import Pending

    url = _toy_checkpoint(tmp_path / "bucket" / "run1")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "keep.txt").write_text("x")  # a cache that is there already is left as it is
    monkeypatch.setenv("DRMAS_CACHE_DIR", str(cache))
    cfg = EvalConfig(model=f"{url}/latest", suite="toy", limit=2, n=1, out=str(tmp_path / "eval"), concurrency=4,
                     max_batch=4, progress=False)

    def no_download(*a, **k):
        raise AssertionError("plan() downloaded")

    with monkeypatch.context() as m:
        m.setattr(checkpoints, "download", no_download)
        p = plan(cfg)
    assert isinstance(p, Pending) and _files(cache) == ["keep.txt"]
    [step] = p.todo
    capsys.readouterr()
    assert main(["eval", "--model", cfg.model, "--suite", "toy", "--limit", "2", "--out", cfg.out, "--dry-run"]) == 0
    assert f"fetch checkpoint {url}/step_1 -> {step.dest} (to do," in capsys.readouterr().out
    assert _files(cache) == ["keep.txt"] and not Path(cfg.out).exists()
    step_dir = tmp_path / "bucket" / "run1" / "step_1"
    eval_bytes = sum(f.stat().st_size for f in step_dir.rglob("*") if f.is_file() and f.parts[-2] != "optim"
                     and f.name != "COMPLETE")
    assert (step.action, step.source, step.size_bytes) == ("fetch checkpoint", f"{url}/step_1", eval_bytes)
    assert step.dest.parent == cache / "checkpoints" and str(step.dest) in p.describe()

    s = evaluate(cfg)
    assert (step.dest / "COMPLETE").read_bytes() == (step_dir / "COMPLETE").read_bytes()
    assert not (step.dest / "optim").exists() and s["micro"]["samples"] == 2
    local = evaluate(EvalConfig(model=str(step_dir), suite="toy", limit=2, n=1, out=str(tmp_path / "local"),
                                concurrency=4, max_batch=4, progress=False))
    assert _episodes(tmp_path / "eval") == _episodes(tmp_path / "local")
    assert _clockless(s["micro"]) == _clockless(local["micro"])
    again = plan(cfg)  # the copy is found: a complete plan, the fetch recorded as done
    assert not isinstance(again, Pending) and [x.done for x in again.resolved.prepared] == [True]
    assert main(["eval", "--model", cfg.model, "--suite", "toy", "--limit", "2", "--n", "1", "--out", cfg.out,
                 "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "(in the cache" in out and "nothing to fetch" in out and "would run 2 questions x 1 samples" in out


def test_a_download_cut_short_resumes_with_the_files_it_lacks(tmp_path, monkeypatch):
    """A fetch that fails after some files is one line saying a second attempt resumes; the partial
    folder keeps the whole files, and the next attempt downloads only the others."""
    url = _toy_checkpoint(tmp_path / "bucket" / "run1")
    monkeypatch.setenv("DRMAS_CACHE_DIR", str(tmp_path / "cache"))
    fs_cls = type(checkpoints.filesystem(url)[0])
    real, got, cut = fs_cls.get_file, [], [True]

    def flaky(self, rpath, lpath, *a, **k):
        got.append(rpath)
        if len(got) == 3 and cut and cut.pop():
            raise ConnectionError("connection reset by peer")
        return real(self, rpath, lpath, *a, **k)

    monkeypatch.setattr(fs_cls, "get_file", flaky)
    with pytest.raises(UserError) as e:
        checkpoint_copies.cached_checkpoint(f"{url}/latest")
    assert "\n" not in str(e.value) and "failed (ConnectionError" in str(e.value) and "run again to resume" in str(e.value)
    first = list(got)
    got.clear()
    dest = checkpoint_copies.cached_checkpoint(f"{url}/latest")
    assert (dest / "COMPLETE").is_file() and (dest / "models" / "checker" / "config.json").is_file()
    total = len([f for f in (tmp_path / "bucket" / "run1" / "step_1").rglob("*")
                 if f.is_file() and "optim" not in f.parts and f.name != "COMPLETE"])
    assert len(first) == 3 and len(got) == total - 2  # the two whole files were kept
    assert not list((tmp_path / "cache" / "checkpoints").glob(".part-*")) and not list(dest.rglob("*.part"))
