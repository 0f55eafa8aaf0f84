"""`drmas-bench eval` of the search suite through the openai engine against a local scripted HTTP
server (`FakeReferenceModel`: a fake model that writes the reference's format), with the real
benchmark file and the real BM25 retriever; checks the recorded turns, the protocol in
summary.json, and that prompts recorded in a trained team's team.yaml reach the model."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from pathlib import Path

import pytest
import yaml
from fastapi import Request as FReq

from drmas_bench.cli import main
from protocol_roles import P

pytestmark = pytest.mark.slow


class FakeReferenceModel:
    """An OpenAI-compatible server that answers like a reference-trained checkpoint: the verifier
    says no until something was retrieved, the searcher searches the question, the answerer answers
    the gold answer (given by the test). The engine templates and cuts prompts with the
    ``tiny-random`` tokenizer and sends token ids to ``/v1/completions``; this server decodes them
    with the same tokenizer and records the chat messages it finds (``bodies[i]["messages"]``)."""

    def __init__(self, gold: dict[str, str]) -> None:
        import uvicorn
        from fastapi import FastAPI

        self.bodies: list[dict] = []
        app = FastAPI()

        from transformers import AutoTokenizer

        from drmas_bench.models import resolve_model

        tok = AutoTokenizer.from_pretrained(resolve_model("tiny-random"))

        def answer(user: str) -> str:
            question = re.search(r"Question: (.*)", user).group(1).strip()
            if "You are the Verifier" in user:
                return "Not yet. <verify>no</verify>" if "<information>" not in user else "Enough. <verify>yes</verify>"
            if "You are the Searcher" in user:
                return f"<think>look it up</think>\n<search>{question}</search>"
            return f"<think>the passages say so</think><answer>{gold.get(question, 'unknown')}</answer>"

        @app.post("/v1/completions")
        async def completions(request: FReq):
            body = await request.json()
            text = tok.decode(body["prompt"], skip_special_tokens=False)
            body["messages"] = [{"role": r, "content": c} for r, c in re.findall(r"<\|im_start\|>(\w+)\n(.*?)<\|im_end\|>", text, re.S)]
            self.bodies.append(body)
            out = answer(body["messages"][-1]["content"])
            return {"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": out, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(out.split())}}

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.time() + 20
        while not self.server.started:
            assert time.time() < deadline, "fake server did not start"
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def served(data_dir):
    from drmas_bench.benchmarks import load_tasks, select_benchmarks

    tasks = load_tasks(select_benchmarks("search", "hotpotqa")[0], data_dir, limit=3)
    s = FakeReferenceModel({t.question: t.answers[0] for t in tasks})
    yield s, tasks
    s.stop()


def _eval(served, data_dir, out, *extra):
    s, _ = served
    return main(["eval", "--model", "fake", "--engine", "openai", "--base-url", s.url, "--tokenizer", "tiny-random", "--suite", "search",
                 "--benchmarks", "hotpotqa", "--limit", "3", "--n", "1", "--no-progress", "--data-dir", str(data_dir),
                 "--out", str(out), *extra])


def test_search_eval_follows_the_reference_loop(served, data_dir, tmp_path):
    s, tasks = served
    assert _eval(served, data_dir, tmp_path / "run") == 0
    recs = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert len(recs) == 3
    for r in recs:
        assert r["task"]["question"].endswith("?")
        turns = r["turns"]
        assert [t["agent"] for t in turns] == ["verifier", "searcher", "verifier", "answerer"]
        assert all(t["valid"] for t in turns) and r["correct"] and r["reward"] == 1.0
        ver, sea, ver2, ans = (t["request"]["messages"] for t in turns)
        assert ver[0] == {"role": "system", "content": "You are a helpful and harmless assistant."} and len(ver) == 2
        # the searcher sees this step's verifier entry, as the reference writes it
        assert '\nThe output of "Verifier Agent": Not yet. <verify>no</verify>\n' in sea[1]["content"]
        assert "<verify>" not in ans[1]["content"].split("# Your role")[0]  # the answerer does not
        step1 = f"Step 1:<search>{r['task']['question']}</search> <information>{{\"result\": \"Doc 1: "
        assert step1 in ver2[1]["content"] and step1 in ans[1]["content"]
        assert all((t["request"]["max_prompt_tokens"], t["request"]["truncate"]) == (4096, "left") for t in turns)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    proto = summary["protocol"]
    assert proto["prompts_sha256"] == P.default_templates("search_route").sha256
    assert proto["calls"] == 12 and proto["prompt_truncated_calls"] == 0
    assert all(b["top_k"] == -1 and isinstance(b["prompt"], list) for b in s.bodies)  # REFERENCE 2b sampling
    # the summary explains the score: the answerer saw the gold in the retrieved passages when the
    # BM25 passages hold it (the plain test: the gold's words in step 1's observation)
    eff = summary["effects"]["search"]
    seen = [any(g.lower() in r["extra"]["env"]["steps"][0]["observation"].lower() for g in r["task"]["answers"])
            for r in recs]
    assert eff["answerer_episodes"] == 3 and eff["evidence_recall"] == pytest.approx(sum(seen) / 3)
    assert (eff["searches_per_episode"], eff["no_answer_rate"]) == (1.0, 0.0)
    md = (tmp_path / "run" / "summary.md").read_text()
    assert "### Why: what the search workflow's agents did to the score" in md and "| evidence recall (%) " in md


def test_checkpoint_prompts_are_used_and_a_flag_override_is_announced(served, data_dir, tmp_path, capsys):
    s, _ = served
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    tpl = P.default_templates("search_route").to_dict()
    tpl["system"] = "You are the trained team."
    (ckpt / "team.yaml").write_text(yaml.safe_dump({
        "workflow": "search_route", "worker_groups": {"g": {"model": "fake", "engine": "openai"}},
        "agents": {"verifier": "g", "searcher": "g", "answerer": "g"}, "prompts": tpl,
        "protocol": {"max_prompt_tokens": 2048, "truncate": "left"}}))
    base = ["eval", "--model", str(ckpt), "--suite", "search", "--benchmarks", "hotpotqa", "--limit", "1", "--n", "1",
            "--no-progress", "--data-dir", str(data_dir), "--base-url", s.url,  # a checkpoint cannot name a URL
            "--engine-args", "tokenizer=tiny-random"]  # nor a tokenizer (engines/carried.py): the user's flag does
    n0 = len(s.bodies)
    assert main(base + ["--out", str(tmp_path / "a")]) == 0
    assert {b["messages"][0]["content"] for b in s.bodies[n0:]} == {"You are the trained team."}
    rec = json.loads((tmp_path / "a" / "samples.jsonl").read_text().splitlines()[0])
    assert rec["turns"][0]["request"]["max_prompt_tokens"] == 2048
    # --prompts and --max-prompt-tokens override the checkpoint's record, and say so
    override = tmp_path / "mine.yaml"
    override.write_text(yaml.safe_dump({"system": "Override."}))
    n1 = len(s.bodies)
    capsys.readouterr()
    assert main(base + ["--out", str(tmp_path / "b"), "--prompts", str(override), "--max-prompt-tokens", "0"]) == 0
    err = capsys.readouterr().err
    assert f"--prompts {override} overrides the prompts recorded in" in err and "--max-prompt-tokens 0 overrides" in err
    assert {b["messages"][0]["content"] for b in s.bodies[n1:]} == {"Override."}
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["protocol"]["max_prompt_tokens"] is None


def test_bad_prompts_file_fails_before_any_model_loads(data_dir, tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"roles": {"verifier": "{{question}} {{history}} {{docs}}"}}))
    t0 = time.perf_counter()
    rc = main(["eval", "--model", "smollm2-135m-instruct", "--suite", "search", "--benchmarks", "hotpotqa",
               "--limit", "1", "--n", "1", "--data-dir", str(data_dir), "--prompts", str(bad), "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and time.perf_counter() - t0 < 5
    assert f"{bad}: roles.verifier: unknown placeholder {{{{docs}}}}" in err
    assert not (tmp_path / "r").exists()
