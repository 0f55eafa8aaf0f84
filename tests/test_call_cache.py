"""The call cache (drmas_bench.call_cache): what makes two calls the same, a store that survives
kill -9 and concurrent processes, damaged files refused, `drmas-bench cache stats|prune`, the
summary's hit/miss counts, and on the hf engine an eval through the cache (all hits, or partly
cached) equal to an uncached one."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from drmas_bench.call_cache import DB_NAME, CallCache, call_key, group_digest, group_identity
from drmas_bench.cli import main
from drmas_bench.types import Completion, Request, Sampling, UserError

REPO = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------------- the key

def _request(**kw) -> Request:
    base = dict(agent="solver", messages=[{"role": "user", "content": "2+2?"}],
                sampling=Sampling(temperature=0.6, top_p=0.95, max_new_tokens=32, seed=7, top_k=-1), sample_idx=0)
    base.update(kw)
    return Request(**base)


def _group(**kw) -> str:
    args = dict(kind="hf", model="tiny-random", model_id={"path": "/x/tiny", "content": "abc123"},
                options={"dtype": "float32", "device": "cpu"})
    args.update(kw)
    return group_digest(group_identity(args["kind"], args["model"], args["model_id"], args["options"]))


def test_every_part_of_the_call_changes_the_key_and_nothing_else_does():
    g, r = _group(), _request()
    key = call_key(g, r)
    assert call_key(_group(), _request()) == key  # pure: the same call, the same key
    s = r.sampling
    changed = {
        "model content": call_key(_group(model_id={"path": "/x/tiny", "content": "other"}), r),
        "engine option dtype": call_key(_group(options={"dtype": "bfloat16", "device": "cpu"}), r),
        "engine option device": call_key(_group(options={"dtype": "float32", "device": "cuda"}), r),
        "chat template kwargs": call_key(_group(options={"dtype": "float32", "device": "cpu",
                                                         "chat_template_kwargs": {"x": 1}}), r),
        "engine kind": call_key(_group(kind="openai", options={"base_url": "http://127.0.0.1:1/v1"}), r),
        "messages": call_key(g, _request(messages=[{"role": "user", "content": "2+3?"}])),
        "role": call_key(g, _request(messages=[{"role": "system", "content": "2+2?"}])),
        "temperature": call_key(g, _request(sampling=replace(s, temperature=0.7))),
        "top_p": call_key(g, _request(sampling=replace(s, top_p=0.9))),
        "top_k": call_key(g, _request(sampling=replace(s, top_k=20))),
        "max new tokens": call_key(g, _request(sampling=replace(s, max_new_tokens=33))),
        "seed": call_key(g, _request(sampling=replace(s, seed=8))),
        "enable_thinking": call_key(g, _request(sampling=replace(s, enable_thinking=True))),
        "sample index": call_key(g, _request(sample_idx=1)),
        "agent (adapter per agent)": call_key(g, _request(agent="checker")),
        "logprobs asked": call_key(g, _request(want_logprobs=True)),
        "prompt limit": call_key(g, _request(max_prompt_tokens=16)),
    }
    same_key = [name for name, k in changed.items() if k == key]
    assert not same_key, f"these parts do not change the key: {same_key}"
    assert len(set(changed.values())) == len(changed)  # and they change it in different ways
    # what cannot change a completion stays out: batching, sleep, where the folder lies, the agent's name
    assert call_key(_group(options={"dtype": "float32", "device": "cpu", "max_batch": 2, "max_wait_ms": 50,
                                    "sleep_mode": "offload"}), r) == key
    # ... where decoding is batch-invariant; the padded batch's replies depend on it, so there it counts
    padded = {"dtype": "float32", "device": "cpu", "batch_invariant": False}
    assert call_key(_group(options={**padded, "max_batch": 2}), r) != call_key(_group(options=padded), r)
    assert call_key(_group(options={**padded, "max_wait_ms": 50}), r) != call_key(_group(options=padded), r)
    assert call_key(_group(options={**padded, "sleep_mode": "offload"}), r) == call_key(_group(options=padded), r)
    assert call_key(_group(options={"dtype": "float32", "device": "cuda:0"}), r) == \
        call_key(_group(options={"dtype": "float32", "device": "cuda:1"}), r)
    assert call_key(_group(model_id={"path": "/elsewhere/copy", "content": "abc123"}), r) == key
    # the agent is part of the call: an engine serving LoRA adapters answers with the agent's adapter
    # (tested above); and each agent's calls draw their own seeds (workflows.base.sample_seed) anyway
    assert call_key(g, _request(truncate="middle")) == key  # no limit: the side means nothing
    # a server's API key and timeouts never enter the key; its URL and served model do
    srv = dict(kind="openai", model="m", model_id=None)
    k1 = call_key(_group(**srv, options={"base_url": "http://127.0.0.1:1/v1", "api_key": "a", "timeout_s": 5}), r)
    assert k1 == call_key(_group(**srv, options={"base_url": "http://127.0.0.1:1/v1", "api_key": "b"}), r)
    assert k1 != call_key(_group(**srv, options={"base_url": "http://127.0.0.1:2/v1"}), r)


def test_auto_device_and_dtype_resolve_as_they_act_here():
    import torch

    here = "cuda" if torch.cuda.is_available() else "cpu"
    auto = group_identity("hf", "m", None, {})["options"]
    assert (auto["device"], auto["dtype"]) == (here, "bfloat16" if here == "cuda" else "float32")
    assert _group(options={}) == _group(options={"device": here, "dtype": auto["dtype"]})
    assert group_identity("hf", "m", None, {}, here=False)["options"]["device"] == "auto"  # on Ray nodes: as written
    with pytest.raises(UserError, match="unknown option"):
        group_identity("hf", "m", None, {"no_such_option": 1})


# ------------------------------------------------------------------------------- the store

def _value(i: int, pad: int = 0) -> dict:
    return {"completion": {"text": f"answer {i}" + "x" * pad, "token_ids": [i, i + 1]}, "latency_s": 0.5, "usd": None}


def test_store_round_trip_and_a_damaged_row_is_never_served(tmp_path):
    with CallCache.open(tmp_path / "c") as cache:
        assert cache.get("k1") is None
        assert cache.put_many([("k1", _value(1), {"model": "m", "engine": "hf"})]) == 1
        assert cache.get("k1") == _value(1)
    con = sqlite3.connect(tmp_path / "c" / DB_NAME)  # a damaged page: the value no longer matches its checksum
    con.execute("UPDATE calls SET value = zeroblob(8) WHERE key = 'k1'")
    con.commit()
    con.close()
    with CallCache.open(tmp_path / "c") as cache:
        assert cache.get("k1") is None and cache.bad_rows == 1
        cache.put_many([("k1", _value(1), {})])  # computed again, the row heals
        assert cache.get("k1") == _value(1)


def test_a_file_that_is_not_a_cache_is_refused_in_one_line(tmp_path):
    d = tmp_path / "c"
    d.mkdir()
    (d / DB_NAME).write_bytes(b"not a database at all" * 100)
    with pytest.raises(UserError, match="not a usable call cache"):
        CallCache.open(d)
    other = tmp_path / "o"
    other.mkdir()
    con = sqlite3.connect(other / DB_NAME)
    con.execute("CREATE TABLE people (name TEXT)")
    con.commit()
    con.close()
    with pytest.raises(UserError, match="not a call cache"):
        CallCache.open(other)
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="not a directory"):
        CallCache.open(tmp_path / "file")


WRITER = textwrap.dedent("""
    import sys, time
    from drmas_bench.call_cache import CallCache
    cache_dir, tag, n, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    cache = CallCache.open(cache_dir)
    for b in range(n):
        # a batch is one transaction: its entries survive together or not at all
        entries = [(f"{tag}-{b}-{i}", {"completion": {"text": "y" * 20000, "token_ids": list(range(500))},
                                       "batch": b, "size": batch, "latency_s": 0.1, "usd": None}, {"model": tag})
                   for i in range(batch)]
        cache.put_many(entries)
        if b == 0:
            print("first batch written", flush=True)
        for i in range(0, batch, 7):  # read what the other writer wrote meanwhile
            cache.get(f"other-{b}-{i}")
    print("done", flush=True)
""")


def _writer(tmp_path: Path, cache_dir: Path, tag: str, n: int, batch: int) -> subprocess.Popen:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, str(script), str(cache_dir), tag, str(n), str(batch)],
                            stdout=subprocess.PIPE, text=True, env=env)


def _all_entries(cache_dir: Path) -> dict[str, dict]:
    con = sqlite3.connect(cache_dir / DB_NAME)
    keys = [k for (k,) in con.execute("SELECT key FROM calls")]
    con.close()
    with CallCache.open(cache_dir) as cache:
        cache.check()  # SQLite's page check
        got = {k: cache.get(k) for k in keys}
        assert cache.bad_rows == 0
    return got


def test_kill_9_while_writing_leaves_whole_entries_only(tmp_path):
    cache_dir = tmp_path / "c"
    for delay in (0.05, 0.3):
        p = _writer(tmp_path, cache_dir, f"kill{delay}", 100000, 40)
        assert p.stdout.readline().strip() == "first batch written"
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
        assert p.returncode == -signal.SIGKILL
    got = _all_entries(cache_dir)
    assert got and all(v is not None for v in got.values())  # every row that exists is whole and served
    by_batch: dict[tuple[str, int], int] = {}
    for k, v in got.items():
        by_batch[(k.rsplit("-", 2)[0], v["batch"])] = by_batch.get((k.rsplit("-", 2)[0], v["batch"]), 0) + 1
        assert v["completion"]["text"] == "y" * 20000 and len(v["completion"]["token_ids"]) == 500
    assert set(by_batch.values()) == {40}  # no batch half-written: a transaction is all or nothing


def test_two_processes_write_and_read_one_cache_at_once(tmp_path):
    cache_dir = tmp_path / "shared"  # both start on a directory with no database: the schema race too
    a = _writer(tmp_path, cache_dir, "other", 60, 10)
    b = _writer(tmp_path, cache_dir, "mine", 60, 10)
    for p in (a, b):
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0 and "done" in out
    got = _all_entries(cache_dir)
    assert len(got) == 2 * 60 * 10 and all(v is not None for v in got.values())


# ------------------------------------------------------------------------------- the CLI

def test_cache_stats_and_prune(tmp_path, capsys):
    d = tmp_path / "c"
    with CallCache.open(d) as cache:
        cache.put_many([(f"a{i}", _value(i, pad=5000), {"model": "tiny-random", "content": "feed01", "engine": "hf"})
                        for i in range(30)])
        cache.put_many([(f"b{i}", _value(i, pad=5000), {"model": "gpt-x", "engine": "openai"}) for i in range(10)])
        cache.con.execute("UPDATE calls SET created = created - 40 * 86400 WHERE key LIKE 'b%'")
    assert main(["cache", "stats", str(d)]) == 0
    out = capsys.readouterr().out
    assert "40 entries" in out and "tiny-random" in out and "gpt-x" in out and "MB on disk" in out
    assert main(["cache", "stats", str(d), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["entries"] == 40 and {m["model"]: m["entries"] for m in st["models"]} == {"tiny-random": 30, "gpt-x": 10}
    assert main(["cache", "prune", str(d), "--older-than", "30"]) == 0
    assert "deleted 10 of 40" in capsys.readouterr().out
    assert main(["cache", "prune", str(d), "--model", "feed"]) == 0  # a content-hash prefix names the model too
    assert "deleted 30 of 30" in capsys.readouterr().out
    with CallCache.open(d) as cache:
        cache.put_many([(f"c{i}", {"completion": {"text": os.urandom(20000).hex()}}, {"model": "m"}) for i in range(20)])
        size = cache.stats()["value_bytes"]
    assert main(["cache", "prune", str(d), "--max-size", str(size / 2 / 1024 / 1024)]) == 0
    with CallCache.open(d) as cache:
        st = cache.stats()
        assert 0 < st["entries"] < 20 and st["value_bytes"] <= size / 2
        assert cache.get("c19") is not None and cache.get("c0") is None  # the oldest went first
    assert st["disk_bytes"] < 20 * 20000  # VACUUM gave the space back
    assert main(["cache", "prune", str(d)]) == 2  # nothing said to delete
    assert "say what to delete" in capsys.readouterr().err
    assert main(["cache", "stats", str(tmp_path / "none")]) == 2
    assert "no call cache here" in capsys.readouterr().err
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / DB_NAME).write_bytes(b"\0garbage" * 512)
    assert main(["cache", "stats", str(tmp_path / "bad")]) == 2
    assert "not a usable call cache" in capsys.readouterr().err
    for argv in (["cache", "--help"], ["cache", "stats", "--help"], ["cache", "prune", "--help"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 0
    assert "--older-than" in capsys.readouterr().out


# ------------------------------------------------------------------------------- evals through the cache

def _eval(tmp_path: Path, name: str, **kw):
    from drmas_bench.api import EvalConfig, evaluate

    cfg = dict(model="tiny-random", suite="toy", n=2, limit=3, max_new_tokens=12, progress=False,
               out=str(tmp_path / name))  # the toy suite is generated: no data files
    cfg.update(kw)
    return evaluate(EvalConfig(**cfg))


def _samples(run_dir: Path) -> dict:
    out = {}
    for line in (Path(run_dir) / "samples.jsonl").read_text().splitlines():
        r = json.loads(line)
        out[(r["task"]["id"], r["sample_idx"])] = r
    return out


def _outcome(r: dict) -> tuple:
    """What must not change when calls come from the cache: every request and response, the answer, the reward."""
    turns = [(t["agent"], t["request"]["messages"], t["request"]["sampling"], t["completion"]["text"],
              t["completion"]["prompt_tokens"], t["completion"]["completion_tokens"], t["completion"]["finish"])
             for t in r["turns"]]
    return turns, r["final_answer"], r["reward"]


def _prices(tmp_path: Path) -> str:
    p = tmp_path / "prices.yaml"
    p.write_text(yaml.safe_dump({"models": {"tiny-random": {"input_per_1m": 1.0, "output_per_1m": 2.0}}}))
    return str(p)


def test_a_second_eval_through_the_cache_is_all_hits_with_the_same_results(tmp_path):
    cache, prices = str(tmp_path / "cache"), _prices(tmp_path)
    plain = _eval(tmp_path, "plain", prices=prices)
    assert plain["cache"] is None and "call cache" not in plain.markdown
    first = _eval(tmp_path, "first", cache=cache, prices=prices)
    second = _eval(tmp_path, "second", cache=cache, prices=prices)
    calls = first["protocol"]["calls"]
    assert (first["cache"]["hits"], first["cache"]["misses"]) == (0, calls)
    assert (second["cache"]["hits"], second["cache"]["misses"]) == (calls, 0)
    assert second["pool"]["requests"] == 0 and second["pool"]["loads"] == 0  # no call reached an engine, none loaded
    assert first["pool"]["requests"] == calls
    a, b, c = _samples(plain.run_dir), _samples(first.run_dir), _samples(second.run_dir)
    assert {k: _outcome(v) for k, v in a.items()} == {k: _outcome(v) for k, v in b.items()} == \
        {k: _outcome(v) for k, v in c.items()}
    assert second["micro"]["avg@n"] == plain["micro"]["avg@n"]
    # latency and $ stay true: the hits cost this run ~nothing, the originals are kept beside them
    hit = c[next(iter(c))]["turns"][0]["completion"]
    orig = b[next(iter(c))]["turns"][0]["completion"]
    assert hit["cache_hit"] is True and "cache_hit" not in orig  # uncached records keep their shape
    assert hit["cached_latency_s"] == pytest.approx(orig["latency_s"]) and hit["latency_s"] < orig["latency_s"] / 10
    assert second["micro"]["usd_total"] == 0.0 and first["micro"]["usd_total"] > 0
    agents = second["cache"]["agents"]
    assert set(agents) == {"solver", "checker"}
    assert sum(a["usd_saved"] for a in agents.values()) == pytest.approx(first["micro"]["usd_total"])
    tokens = sum(t["completion"]["prompt_tokens"] + t["completion"]["completion_tokens"] for r in b.values() for t in r["turns"])
    assert sum(a["tokens_saved"] for a in agents.values()) == tokens
    assert all(a["seconds_saved"] > 0 for a in agents.values())
    summary = json.loads((Path(second.run_dir) / "summary.json").read_text())
    assert summary["cache"]["dir"] == cache and set(summary["cache"]) == {"dir", "hits", "misses", "agents"}
    md = (Path(second.run_dir) / "summary.md").read_text()
    assert "- solver: 6 hits, 0 misses" in md and "- checker: 6 hits, 0 misses" in md


def test_a_partly_cached_eval_equals_an_uncached_one_exactly(tmp_path):
    cache = str(tmp_path / "cache")
    plain = _eval(tmp_path, "plain", n=3)
    _eval(tmp_path, "part", n=3, limit=1, cache=cache)  # the first question's calls only
    _eval(tmp_path, "other", n=3, cache=cache, temperature=0.9)  # other sampling: its entries must not be served
    mixed = _eval(tmp_path, "mixed", n=3, cache=cache)
    calls = mixed["protocol"]["calls"]
    assert 0 < mixed["cache"]["hits"] < calls and mixed["cache"]["hits"] + mixed["cache"]["misses"] == calls
    a, b = _samples(plain.run_dir), _samples(mixed.run_dir)
    assert {k: _outcome(v) for k, v in a.items()} == {k: _outcome(v) for k, v in b.items()}
    assert mixed["micro"]["avg@n"] == plain["micro"]["avg@n"]


def test_the_cache_is_not_part_of_the_run_identity(tmp_path):
    from drmas_bench.api import EvalConfig
    from drmas_bench.plan import plan

    base = EvalConfig(model="tiny-random", suite="toy", n=2, limit=2, max_new_tokens=12, progress=False)
    p1, p2 = plan(base), plan(replace(base, cache=str(tmp_path / "c")))
    assert p1.out == p2.out and p1.config_doc["identity"] == p2.config_doc["identity"]
    # an uncached run resumed with the cache on (and grown): accepted, the kept samples stay
    _eval(tmp_path, "run", n=2, limit=2)
    resumed = _eval(tmp_path, "run", n=3, limit=2, cache=str(tmp_path / "c"))
    assert resumed["run"]["episodes_resumed"] == 4 and resumed["run"]["episodes_run"] == 2
    assert resumed["cache"]["misses"] == resumed["protocol"]["calls"]  # kept calls count as computed ones


def test_team_file_cache_key_and_the_refusals(tmp_path):
    from drmas_bench.api import EvalConfig, evaluate
    from drmas_bench.plan import plan

    team = {"worker_groups": {"g": {"model": "tiny-random"}}, "agents": {"solver": "g", "checker": "g"}, "cache": "calls"}
    (tmp_path / "team.yaml").write_text(yaml.safe_dump(team))
    cfg = EvalConfig(team=str(tmp_path / "team.yaml"), suite="toy", n=1, limit=1, progress=False)
    p = plan(cfg)
    assert Path(p.call_cache_dir) == tmp_path / "calls"  # relative to the file
    assert not (tmp_path / "calls").exists()  # a plan opens nothing: the run opens (and makes) the cache
    p = plan(replace(cfg, cache=str(tmp_path / "flag")))  # the flag wins
    assert Path(p.call_cache_dir) == tmp_path / "flag"
    ckpt = tmp_path / "ckpt"  # a team.yaml inside a model folder is data: it may not choose where we write
    ckpt.mkdir()
    (ckpt / "team.yaml").write_text(yaml.safe_dump(team))
    with pytest.raises(UserError, match="sets cache"):
        plan(EvalConfig(model=str(ckpt), suite="toy", progress=False))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / DB_NAME).write_bytes(b"garbage" * 100)
    out = tmp_path / "never"
    with pytest.raises(UserError, match="not a usable call cache"):
        evaluate(replace(cfg, cache=str(bad), out=str(out)))
    assert not out.exists()  # refused before the run directory (and any model) was touched


CONCURRENT_EVAL = textwrap.dedent("""
    import sys
    from drmas_bench.api import EvalConfig, evaluate
    out, cache, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
    s = evaluate(EvalConfig(model="tiny-random", suite="toy", n=2, limit=limit, max_new_tokens=12, progress=False,
                            out=out, cache=cache, max_batch=2))
    print("hits", s["cache"]["hits"], "misses", s["cache"]["misses"], flush=True)
""")


@pytest.mark.slow  # two eval processes at once plus two more evals: the end-to-end tier
def test_two_concurrent_evals_sharing_one_cache_stay_correct(tmp_path):
    script = tmp_path / "ev.py"
    script.write_text(CONCURRENT_EVAL)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cache = tmp_path / "cache"
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path / name), str(cache), str(limit)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for name, limit in (("a", 4), ("b", 3))]
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-2000:]
    plain = _eval(tmp_path, "plain", n=2, limit=4)
    want = {k: _outcome(v) for k, v in _samples(plain.run_dir).items()}
    for name in ("a", "b"):
        got = {k: _outcome(v) for k, v in _samples(tmp_path / name).items()}
        assert got == {k: want[k] for k in got}
    again = _eval(tmp_path, "again", n=2, limit=4, cache=str(cache))
    assert again["cache"]["misses"] == 0  # between them, the two filled the cache with every call
    assert {k: _outcome(v) for k, v in _samples(again.run_dir).items()} == want


def test_the_cache_costs_far_under_two_percent_of_an_hf_call():
    sys.path.insert(0, str(REPO / "scripts"))
    from bench_cache import lookup_overhead

    r = lookup_overhead("tiny-random", calls=4, prompt_words=100, max_new_tokens=16)
    assert r["miss_ratio"] < 0.02 and r["hit_ratio"] < 0.02, r  # measured ~0.1% on tiny-random
    assert r["hit_speedup"] > 50


def test_eval_flag_cache_reaches_the_config():
    from drmas_bench.cli import build_parser
    from drmas_bench.commands.eval import config_from_args

    args = build_parser().parse_args(["eval", "--model", "tiny-random", "--suite", "toy", "--cache", "runs/cache"])
    assert config_from_args(args).cache == "runs/cache"
    args = build_parser().parse_args(["eval", "--model", "tiny-random", "--suite", "toy"])
    assert config_from_args(args).cache is None  # off unless asked
