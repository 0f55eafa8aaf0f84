"""`drmas_bench.evaluate(EvalConfig)`: the library entry point, its precedence rule (defaults < team
file < explicit values), `--engine-args`, provenance, and the same summary as the CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from drmas_bench.api import EvalConfig, parse_engine_args, resolve
from drmas_bench.cli import build_parser, main
from drmas_bench.commands.eval import config_from_args
from drmas_bench.types import UserError


def _team_file(path: Path, **extra) -> Path:
    team = {"sampling": {"temperature": 0.3, "max_new_tokens": 5},
            "worker_groups": {"g": {"model": "tiny-random", "options": {"max_batch": 4}}},
            "agents": {"solver": "g", "checker": {"wg": "g", "sampling": {"max_new_tokens": 7, "top_p": 0.5}}}, **extra}
    path.write_text(yaml.safe_dump(team))
    return path


def test_import_is_cheap_and_exports_the_api():
    code = ("import sys, drmas_bench; assert 'drmas_bench.api' not in sys.modules; "
            "from drmas_bench import evaluate, EvalConfig, Summary; "
            "assert callable(evaluate) and EvalConfig.__name__ == 'EvalConfig'; "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_team_file_beats_defaults_and_explicit_values_beat_the_team_file(tmp_path):
    team = str(_team_file(tmp_path / "team.yaml"))
    r = resolve(EvalConfig(team=team, suite="toy"))
    solver, checker = (r.team.sampling_for(a, r.sampling) for a in ("solver", "checker"))
    assert (solver.temperature, solver.top_p, solver.max_new_tokens) == (0.3, 0.95, 5)  # team < defaults
    assert (checker.temperature, checker.top_p, checker.max_new_tokens) == (0.3, 0.5, 7)  # per agent
    r = resolve(EvalConfig(team=team, suite="toy", max_new_tokens=64, top_p=0.9, enable_thinking=True))
    for agent in ("solver", "checker"):  # explicit values hold for every agent, over team and per-agent sampling
        s = r.team.sampling_for(agent, r.sampling)
        assert (s.temperature, s.top_p, s.max_new_tokens, s.enable_thinking) == (0.3, 0.9, 64, True)
    assert r.team.to_dict()["sampling"] == {"temperature": 0.3, "max_new_tokens": 5}  # the team record is unchanged


def test_explicit_flags_win_over_a_checkpoint_team_yaml(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()  # a checkpoint's team.yaml carries only the options that shape numbers (its engines' dtype)
    _team_file(ckpt / "team.yaml", worker_groups={"g": {"model": "tiny-random", "options": {"dtype": "bfloat16"}}})
    args = build_parser().parse_args(["eval", "--model", str(ckpt), "--suite", "toy", "--max-new-tokens", "4096",
                                      "--max-batch", "2", "--engine-args", "dtype=float32"])
    r = resolve(config_from_args(args))
    assert {r.team.sampling_for(a, r.sampling).max_new_tokens for a in r.team.agents} == {4096}
    assert r.team.worker_groups["g"].options == {"dtype": "float32", "max_batch": 2}  # over the file's options
    args = build_parser().parse_args(["eval", "--model", str(ckpt), "--suite", "toy"])
    r = resolve(config_from_args(args))
    assert r.team.sampling_for("solver", r.sampling).max_new_tokens == 5  # no flag: the checkpoint's budget
    assert r.team.worker_groups["g"].options == {"dtype": "bfloat16"}  # and its engines' dtype


def test_workflow_is_chosen_before_the_team_is_validated(tmp_path):
    team = tmp_path / "math_team.yaml"
    team.write_text(yaml.safe_dump({"workflow": "math_refine", "worker_groups": {"g": "tiny-random"},
                                    "agents": {"solver": "g", "verifier": "g"}}))
    r = resolve(EvalConfig(team=str(team), suite="toy"))  # the toy suite's default workflow has no verifier
    assert r.wf.name == r.team.workflow == "math_refine"
    with pytest.raises(UserError, match="unknown agent 'verifier'"):  # an explicit workflow wins over the file's
        resolve(EvalConfig(team=str(team), suite="toy", workflow="toy"))


def test_engine_args_set_any_engine_option(tmp_path):
    assert parse_engine_args("dtype=bfloat16, max_batch=8,auto_wake=false,chat_template_kwargs={a: 1, b: 2}") == {
        "dtype": "bfloat16", "max_batch": 8, "auto_wake": False, "chat_template_kwargs": {"a": 1, "b": 2}}
    with pytest.raises(UserError, match="KEY=VALUE"):
        parse_engine_args("dtype")
    args = build_parser().parse_args(["eval", "--model", "tiny-random", "--suite", "toy", "--model-args",
                                      "dtype=float32,device=cpu", "--output-dir", str(tmp_path / "o")])
    cfg = config_from_args(args)
    assert cfg.engine_args == {"dtype": "float32", "device": "cpu"} and cfg.out == str(tmp_path / "o")
    assert resolve(cfg).team.worker_groups["shared"].options == {"max_batch": 32, "dtype": "float32", "device": "cpu"}
    team = str(_team_file(tmp_path / "team.yaml"))
    r = resolve(EvalConfig(team=team, suite="toy", engine_args={"max_batch": 16}))
    assert r.team.worker_groups["g"].options["max_batch"] == 16
    assert EvalConfig(engine_args={"api_key": "sk-1"}).to_dict()["engine_args"] == {"api_key": "<redacted>"}
    with pytest.raises(UserError, match="mem_fraction_static: not an option of the hf engine"):
        resolve(EvalConfig(model="tiny-random", suite="toy", engine_args={"mem_fraction_static": 0.7}))


def test_bad_config_values_are_one_line_errors():
    for cfg, msg in ((EvalConfig(model="tiny-random", suite="toy", n=0), "--n must be an integer >= 1"),
                     (EvalConfig(model="tiny-random", suite="toy", n="2"), "--n must be an integer >= 1, got '2'"),
                     (EvalConfig(model="tiny-random", suite="toy", engine="vllm"), "--engine must be one of hf"),
                     (EvalConfig(model="tiny-random", suite="toy", enable_thinking="yes"), "enable_thinking: must be true or false")):
        from drmas_bench.api import evaluate

        with pytest.raises(UserError, match=re.escape(msg)):
            evaluate(cfg)


def test_provenance_collects_versions_commit_and_hardware():
    from drmas_bench.provenance import collect

    p = collect(argv=["drmas-bench", "eval", "--engine-args", "api_key=sk-123,timeout_s=5"])
    assert p["package"]["version"] and p["python"]
    assert p["argv"] == ["drmas-bench", "eval", "--engine-args", "api_key=<redacted>,timeout_s=5"]
    assert "transformers" in p["libraries"] and "torch" in p["libraries"]
    assert p["hardware"]["cpu_count"] >= 1 and p["hardware"]["gpu_count"] == len(p["hardware"]["gpus"])
    repo = Path(__file__).resolve().parent.parent
    if (repo / ".git").exists():  # a git checkout (a worktree has a .git file): the commit is recorded
        assert re.fullmatch(r"[0-9a-f]{40}", p["git"]["commit"]) and isinstance(p["git"]["dirty"], bool)


# --------------------------------------------------------------------------- end to end, tiny model

PROVENANCE_KEYS = {"package", "git", "python", "platform", "libraries", "hardware", "argv", "started_at", "data",
                   "models", "grader", "prompts", "workflow", "eval_config"}


def _comparable(summary: dict) -> dict:
    """A summary without what differs between two identical runs: times, latencies, memory peaks, paths, provenance."""
    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items()
                    if not any(w in k for w in ("latency", "wall", "dir", "provenance", "_s", "peak_"))}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x
    return strip(summary)


@pytest.mark.slow
def test_cli_and_library_give_the_same_summary_with_provenance(tmp_path, capsys):
    from drmas_bench import EvalConfig, evaluate

    cli_run, api_run = tmp_path / "cli", tmp_path / "api"
    argv = ["eval", "--model", "tiny-random", "--suite", "toy", "--n", "2", "--limit", "3", "--max-new-tokens", "12",
            "--no-progress", "--out", str(cli_run)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    s = evaluate(EvalConfig(model="tiny-random", suite="toy", n=2, limit=3, max_new_tokens=12, progress=False,
                            out=str(api_run)))
    cli = json.loads((cli_run / "summary.json").read_text())
    assert s.to_dict() == json.loads((api_run / "summary.json").read_text()) and s.run_dir == api_run
    assert _comparable(cli) == _comparable(s.to_dict()) and s["run"]["episodes_run"] == 6
    # the CLI prints the same Markdown (the header's date and run dir differ between the two runs)
    assert printed.startswith("# toy suite (toy): tiny-random, ") and s.markdown.startswith("# toy suite (toy): tiny-random, ")
    accuracy = s.markdown[s.markdown.index("### Accuracy"):].splitlines()[:6]
    assert all(line in printed for line in accuracy)
    # same identity: the library resumes the CLI's run (provenance differs and does not block it)
    again = evaluate(EvalConfig(model="tiny-random", suite="toy", n=2, limit=3, max_new_tokens=12, progress=False,
                                out=str(cli_run)))
    assert again["run"]["episodes_resumed"] == 6
    assert {k: _comparable(again[k]) for k in ("benchmarks", "micro", "macro")} == \
        {k: _comparable(cli[k]) for k in ("benchmarks", "micro", "macro")}
    # provenance in every new run: config.yaml (at the start) and summary.json (with end and duration)
    for run, summary in ((cli_run, cli), (api_run, s.to_dict())):
        conf = yaml.safe_load((run / "config.yaml").read_text())
        assert PROVENANCE_KEYS <= set(conf["provenance"]) and "provenance" not in conf["identity"]
        prov = summary["provenance"]
        assert PROVENANCE_KEYS | {"finished_at", "duration_s"} <= set(prov)
        assert prov["finished_at"] >= prov["started_at"] and prov["duration_s"] >= 0
        assert prov["data"] == {"toy": conf["data"]["toy"]} and prov["models"]["shared"]["content"]
        assert prov["workflow"]["name"] == "toy" and re.fullmatch(r"[0-9a-f]{16}", prov["workflow"]["code_sha256"])
        assert prov["grader"] == {"family": "toy"}
    assert cli["provenance"]["argv"] == ["drmas-bench", *argv]
    assert s["provenance"]["argv"] is None and s["provenance"]["eval_config"]["n"] == 2


def test_explicit_engine_moves_every_worker_group(tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "team.yaml").write_text(yaml.safe_dump({
        "worker_groups": {"g": {"model": "tiny-random", "engine": "sglang", "options": {"dtype": "float16"}}},
        "agents": {"solver": "g", "checker": "g"}}))
    assert resolve(EvalConfig(model=str(ckpt), suite="toy")).team.worker_groups["g"].engine == "sglang"
    g = resolve(EvalConfig(model=str(ckpt), suite="toy", engine="hf")).team.worker_groups["g"]
    assert (g.engine, g.options) == ("hf", {"dtype": "float16"})  # an option the hf engine has too stays
    g = resolve(EvalConfig(model=str(ckpt), suite="toy", engine="openai", base_url="http://127.0.0.1:9/v1")).team.worker_groups["g"]
    assert (g.engine, g.base_url, g.options) == ("openai", "http://127.0.0.1:9/v1", {})
    err = capsys.readouterr().err
    assert "leaves its sglang option(s) dtype behind" in err
    assert "engine options from the checkpoint: dtype=float16 (your flags changed: dtype=(left out))" in err
    team = tmp_path / "remote.yaml"
    team.write_text(yaml.safe_dump({"worker_groups": {"r": {"model": "m", "engine": "openai", "base_url": "http://127.0.0.1:9/v1"}},
                                    "agents": {"solver": "r", "checker": "r"}}))
    with pytest.raises(UserError, match="cannot run in-process"):
        resolve(EvalConfig(team=str(team), suite="toy", engine="hf"))
