"""Security: the trust boundary (docs/security.md), names that become paths, one writer per run
directory, identity by content, and error.log for unexpected errors.

Real parts throughout: the CLI's ``main``, a real HTTP server on 127.0.0.1 that records the
``Authorization`` header of every request it gets, real subprocesses holding the lock (one of them
SIGKILLed), real model folders (copies of the prepared ``tiny-random``).
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from drmas_bench.agents.team import build_team
from drmas_bench.cli import main
from drmas_bench.files import inside, model_identity, safe_name
from drmas_bench.run_dir import RunDir, RunLock
from drmas_bench.types import UserError

AGENTS = ("solver", "checker")
TOY = ["eval", "--suite", "toy", "--n", "1", "--limit", "1", "--no-progress"]


class RecordingServer:
    """An OpenAI-compatible chat server on 127.0.0.1 that records each request's Authorization header."""

    def __init__(self) -> None:
        self.auth: list[str | None] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("content-length", 0)))
                outer.auth.append(self.headers.get("Authorization"))
                body = json.dumps({"choices": [{"message": {"content": "<answer>4</answer>"}, "finish_reason": "stop"}],
                                   "usage": {"prompt_tokens": 3, "completion_tokens": 2}}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = RecordingServer()
    yield s
    s.close()


@pytest.fixture
def tiny_dir() -> Path:
    from drmas_bench.models import alias_path, is_prepared

    if not is_prepared("tiny-random"):
        pytest.skip("tiny-random not prepared (drmas-bench models prepare tiny-random)")
    return alias_path("tiny-random")


def _checkpoint(root: Path, team_yaml: str, model_src: Path | None = None) -> Path:
    """A folder shaped like a trainer checkpoint: team.yaml (+ models/g copied from ``model_src``)."""
    root.mkdir(parents=True)
    if model_src is not None:
        shutil.copytree(model_src, root / "models" / "g")
    (root / "team.yaml").write_text(team_yaml)
    return root


# ------------------------------------------------------------------------------- 1. trust boundary


def test_checkpoint_team_cannot_run_shipped_code(tmp_path, tiny_dir, capsys, monkeypatch):
    """A checkpoint ships a Python file named by config.json's auto_map and a team.yaml turning on
    trust_remote_code: eval refuses in one line naming the flag, and the file never runs."""
    monkeypatch.chdir(tmp_path)
    ck = _checkpoint(tmp_path / "ck", "workflow: toy\nworker_groups: {g: {model: models/g, options: {trust_remote_code: true}}}\n"
                                      "agents: {solver: g, checker: g}\n", tiny_dir)
    cfg = json.loads((ck / "models/g/config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    (ck / "models/g/config.json").write_text(json.dumps(cfg))
    marker = tmp_path / "RAN"
    (ck / "models/g/evil.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n")
    assert main(TOY + ["--model", str(ck), "--out", "run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "sets options.trust_remote_code" in err and "--trust-remote-code" in err
    assert not marker.exists() and not (tmp_path / "run").exists()
    # the user's own flag allows it (and sets it for the group)
    team = build_team("toy", AGENTS, model=str(ck), trust_remote_code=True)
    assert team.worker_groups["g"].options["trust_remote_code"] is True


UNTRUSTED = [  # (worker group YAML, the flag the refusal must name)
    ("{model: m, engine: openai, base_url: 'http://127.0.0.1:9/v1'}", "--team"),
    ("{model: m, engine: openai, api_key_env: MY_KEY}", "--team"),
    ("{model: m, engine: openai, options: {base_url: 'http://127.0.0.1:9/v1'}}", "--team"),
    ("{model: m, engine: openai, options: {api_key: sk-theirs}}", "--team"),
    ("{model: m, engine: sglang, options: {engine_args: {load_format: dummy}}}", "--team"),
    ("{model: m, engine: hf, options: {attn_implementation: 'kernels-community/flash-attn'}}", "--team"),
    ("{model: m, engine: hf, options: {trust_remote_code: true}}", "--trust-remote-code"),
    ("{model: 'http://10.0.0.1/internal/model', engine: hf}", "--team"),  # fetched with the user's credentials
    ("{model: 's3://their-bucket/m', engine: hf}", "--team"),
]


@pytest.mark.parametrize("wg,flag", UNTRUSTED)
def test_implicit_team_refuses_trusted_only_keys_explicit_team_allows_them(tmp_path, monkeypatch, wg, flag):
    monkeypatch.setenv("MY_KEY", "sk-mine")
    ck = _checkpoint(tmp_path / "ck", f"workflow: toy\nworker_groups: {{g: {wg}}}\nagents: {{solver: g, checker: g}}\n")
    with pytest.raises(UserError) as e:
        build_team("toy", AGENTS, model=str(ck))
    assert str(ck / "team.yaml") in str(e.value) and flag in str(e.value)
    build_team("toy", AGENTS, team_file=str(ck / "team.yaml"))  # the same file passed with --team is trusted


def test_checkpoint_base_url_never_gets_the_key(tmp_path, server, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-dummy-secret")
    ck = _checkpoint(tmp_path / "ck", f"workflow: toy\nworker_groups: {{g: {{model: m, engine: openai, base_url: '{server.url}'}}}}\n"
                                      "agents: {solver: g, checker: g}\n")
    assert main(TOY + ["--model", str(ck), "--out", "run"]) == 2
    assert "sets base_url" in capsys.readouterr().err
    assert server.auth == []  # not one request reached the checkpoint's URL


def test_api_key_env_is_sent_only_to_its_base_url(tmp_path, server, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-default-key")
    monkeypatch.setenv("MY_KEY", "sk-mine")
    team = tmp_path / "team.yaml"
    team.write_text(f"workflow: toy\nworker_groups: {{g: {{model: m, engine: openai, base_url: '{server.url}', "
                    f"api_key_env: MY_KEY, options: {{max_retries: 0}}}}}}\nagents: {{solver: g, checker: g}}\n")
    assert main(TOY + ["--team", str(team), "--out", "run"]) == 0
    assert server.auth and set(server.auth) == {"Bearer sk-mine"}
    for name in ("config.yaml", "samples.jsonl", "summary.json"):  # the key itself is never written down
        assert "sk-mine" not in (tmp_path / "run" / name).read_text()
    monkeypatch.delenv("MY_KEY")
    assert main(TOY + ["--team", str(team), "--out", "run2"]) == 2
    assert "api_key_env MY_KEY is not set" in capsys.readouterr().err


def test_literal_api_key_is_not_written_to_the_run_config(tmp_path, server, monkeypatch):
    monkeypatch.chdir(tmp_path)
    team = tmp_path / "team.yaml"
    team.write_text(f"workflow: toy\nworker_groups: {{g: {{model: m, engine: openai, base_url: '{server.url}', "
                    f"options: {{api_key: sk-literal, max_retries: 0}}}}}}\nagents: {{solver: g, checker: g}}\n")
    assert main(TOY + ["--team", str(team), "--out", "run"]) == 0
    assert set(server.auth) == {"Bearer sk-literal"}
    assert "sk-literal" not in (tmp_path / "run" / "config.yaml").read_text()


# ------------------------------------------------------------------------------- 2. names that become paths


@pytest.mark.parametrize("name", ["..", "../x", "a/b", "/tmp/x", "a..b", "", "a b", "x\n", "é"])
def test_unsafe_names_are_refused(name):
    with pytest.raises(UserError, match="not a valid name"):
        safe_name(name, "worker group")


@pytest.mark.parametrize("name", ["solver", "Qwen2.5-7B-Instruct", "wg_1", "a.b"])
def test_safe_names_pass(name):
    assert safe_name(name, "worker group") == name


def test_checkpoint_members_stay_inside(tmp_path):
    from drmas_trainer.checkpoint import member

    (tmp_path / "ck" / "models").mkdir(parents=True)
    assert member(tmp_path / "ck", "models", "solver") == (tmp_path / "ck" / "models" / "solver").resolve()
    for bad in ("../x", "/abs", ".."):
        with pytest.raises(UserError):
            member(tmp_path / "ck", "models", bad)
    (tmp_path / "ck" / "models" / "link").symlink_to(tmp_path)  # a planted symlink leads outside
    with pytest.raises(UserError, match="outside the run directory"):
        member(tmp_path / "ck", "models", "link")
    with pytest.raises(UserError):
        inside(tmp_path / "ck", tmp_path / "ck" / ".." / "x")


def test_planted_symlink_in_a_run_dir_is_refused(tmp_path):
    """A run folder from elsewhere whose samples.jsonl points outside: never appended to or truncated."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "samples.jsonl").symlink_to(victim)
    with pytest.raises(UserError, match="outside the run directory"):
        RunDir(tmp_path / "run", {"identity": {}})
    assert victim.read_text() == "keep me"


# ------------------------------------------------------------------------------- 3. one writer

HOLD = "import sys, time; from drmas_bench.run_dir import RunLock; l = RunLock(sys.argv[1]); print('locked', flush=True); time.sleep(120)"


def _holder(run: Path) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "locked"
    return p


def test_second_writer_is_refused_and_dead_holder_is_taken_over(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    holder = _holder(run)
    try:
        with pytest.raises(UserError, match=f"in use by another drmas-bench process \\(PID {holder.pid}\\)"):
            RunLock(run)
        monkeypatch.chdir(tmp_path)
        assert main(TOY + ["--model", "tiny-random", "--out", str(run)]) == 2
        assert f"PID {holder.pid}" in capsys.readouterr().err
        assert main(["train", "--recipe", "tiny", "--out", str(run), "--local", "--no-progress"]) == 2
        assert f"PID {holder.pid}" in capsys.readouterr().err
        assert not (run / "config.yaml").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with RunLock(run) as lock:  # the kernel dropped the dead holder's flock: taken over
        assert lock.path.read_text().strip() == str(os.getpid())


def test_lock_is_released_when_the_run_dir_closes(tmp_path):
    store = RunDir(tmp_path / "run", {"identity": {}})
    with pytest.raises(UserError, match="in use"):
        RunDir(tmp_path / "run", {"identity": {}})  # a second opener in the same process, too
    store.close()
    RunDir(tmp_path / "run", {"identity": {}}).close()


# ------------------------------------------------------------------------------- 4. identity by content


def test_model_identity_follows_content(tmp_path, monkeypatch):
    monkeypatch.setenv("DRMAS_CACHE_DIR", str(tmp_path / "cache"))
    m = tmp_path / "m"
    m.mkdir()
    (m / "config.json").write_text('{"a": 1}')
    big = m / "model.safetensors"
    big.write_bytes(b"h" * 4096 + bytes(9 * 1024 * 1024))  # over PARTIAL_HASH_OVER: hashed by head/tail/size
    first = model_identity(m)
    assert first == model_identity(m) and first["path"] == str(m.resolve())
    assert (tmp_path / "cache" / "fingerprints.json").is_file()
    link = tmp_path / "latest"
    link.symlink_to(m)
    assert model_identity(link) == first  # what the path resolves to, not its text
    (m / "config.json").write_text('{"a": 2}')
    second = model_identity(m)
    assert second["content"] != first["content"]
    with open(big, "r+b") as f:  # a new header (same size, new mtime)
        f.write(b"H")
    assert model_identity(m)["content"] != second["content"]


def _with_samples(run: Path, config: dict) -> None:
    store = RunDir(run, config)
    store.samples_path.write_text('{"task": {"benchmark": "toy", "id": "t0"}, "sample_idx": 0, "turns": []}\n')
    store.close()


def test_resume_onto_other_weights_or_data_is_refused(tmp_path):
    base = {"identity": {"models": {"shared": {"path": "/m/s1", "content": "aaaa"}}}, "data": {"aime24": "sha256:1"}}
    _with_samples(tmp_path / "run", base)
    moved = {"identity": {"models": {"shared": {"path": "/m/s2", "content": "bbbb"}}}, "data": {"aime24": "sha256:1"}}
    with pytest.raises(UserError, match=r"models\.shared \(was /m/s1, content aaaa; now /m/s2, content bbbb\)"):
        RunDir(tmp_path / "run", moved)
    edited = {**base, "data": {"aime24": "sha256:2"}}
    with pytest.raises(UserError, match=r"differs in: data\.aime24"):
        RunDir(tmp_path / "run", edited)
    grown = {**base, "data": {"aime25": "sha256:9"}}  # another benchmark may join the run
    RunDir(tmp_path / "run", grown).close()
    import yaml

    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["data"] == {"aime24": "sha256:1", "aime25": "sha256:9"}
    RunDir(tmp_path / "run", moved, fresh=True).close()  # --fresh starts over


@pytest.mark.slow
def test_eval_refuses_resume_after_latest_moved(tmp_path, tiny_dir, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_dir, tmp_path / "s1")
    shutil.copytree(tiny_dir, tmp_path / "s2")
    gen = json.loads((tmp_path / "s2" / "generation_config.json").read_text())
    (tmp_path / "s2" / "generation_config.json").write_text(json.dumps({**gen, "note": "step 2"}))
    (tmp_path / "latest").symlink_to("s1")
    argv = TOY + ["--model", "latest", "--out", "run", "--max-new-tokens", "4"]
    assert main(argv) == 0
    (tmp_path / "latest").unlink()
    (tmp_path / "latest").symlink_to("s2")
    assert main([a if a != "1" or argv[i - 1] != "--limit" else "2" for i, a in enumerate(argv)]) == 2  # --limit 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "models.shared" in err and str(tmp_path / "s2") in err
    assert len((tmp_path / "run" / "samples.jsonl").read_text().splitlines()) == 1  # nothing mixed in


# ------------------------------------------------------------------------------- 7. error.log


def test_unexpected_error_keeps_its_traceback_in_error_log(tmp_path, server, capsys, monkeypatch):
    """A bug (here a fake: summarize raises) is one line pointing at RUN/error.log; samples are kept."""
    from drmas_bench import metrics

    def fake_summarize(*a, **k):
        raise RuntimeError("fake bug in summarize")

    monkeypatch.setattr(metrics, "summarize", fake_summarize)
    monkeypatch.chdir(tmp_path)
    team = tmp_path / "team.yaml"
    team.write_text(f"workflow: toy\nworker_groups: {{g: {{model: m, engine: openai, base_url: '{server.url}', "
                    f"options: {{max_retries: 0}}}}}}\nagents: {{solver: g, checker: g}}\n")
    assert main(TOY + ["--team", str(team), "--out", "run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "unexpected error (RuntimeError: fake bug in summarize)" in err and "run/error.log" in err
    log = (tmp_path / "run" / "error.log").read_text()
    assert "Traceback" in log and "fake_summarize" in log
    assert (tmp_path / "run" / "samples.jsonl").read_text().count("\n") == 1
