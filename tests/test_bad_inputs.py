"""Bad inputs over the CLI: each case is a command, the exit code and the one line it must print.

Every case fails before a model loads, so the table runs in a few seconds. A case passes only if
the command returns the code (no traceback escapes ``main``), stderr's error is one line holding
the expected text, and (for eval) the run directory holds no config.yaml afterwards: a mistake never
leaves an identity behind that would refuse the corrected command.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from drmas_bench.cli import main

TEAM_OK = "worker_groups: {g: tiny-random}\nagents: {solver: g, checker: g}\n"
BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdefgh", "bcdefghi"))

# name -> file contents (str: UTF-8 text, bytes: written as is); created in the test's directory
FILES: dict[str, str | bytes] = {
    "latin1_team.yaml": "workflow: toy\n# caf\xe9\n".encode("latin-1"),
    "latin1_prices.yaml": "models:\n  tiny-random: {input_per_1m: 1}\n# \xe9\n".encode("latin-1"),
    "data_latin1/math/aime24/test.jsonl": b'{"id": 1, "problem": "caf\xe9", "answer": "1"}\n',
    "data_badans/qa/nq/test.jsonl": json.dumps({"id": "a", "question": "q?", "golden_answers": [["x"], {"a": 1}]}) + "\n",
    "wg_list.yaml": "worker_groups: [a, b]\nagents: {solver: a, checker: a}\n",
    "agents_list.yaml": "worker_groups: {g: tiny-random}\nagents: [solver, checker]\n",
    "team_list.yaml": "- a\n- b\n",
    "samp_str.yaml": TEAM_OK + "sampling: {temperature: hot}\n",
    "samp_topp.yaml": TEAM_OK + "agents: {solver: {wg: g, sampling: {top_p: 0}}, checker: g}\n",
    "samp_tokens.yaml": TEAM_OK + "sampling: {max_new_tokens: 2.5}\n",
    "wfopt_unknown.yaml": TEAM_OK + "workflow_options: {roundz: 3}\n",
    "wfopt_type.yaml": TEAM_OK + "workflow_options: {rounds: many}\n",
    "wfopt_list.yaml": TEAM_OK + "workflow_options: [1, 2]\n",
    "bomb.yaml": TEAM_OK + "workflow_options:\n" + "".join(f"  {line}\n" for line in BOMB.splitlines()),
    "recursive.yaml": TEAM_OK + "workflow_options: {rounds: &r [1, *r]}\n",
    "big.yaml": "# " + "x" * (9 * 1024 * 1024) + "\n",
    "bad_yaml.yaml": "worker_groups: {g: tiny-random\nagents: {}\n",
    "engine_opt.yaml": "worker_groups: {g: {model: tiny-random, options: {max_btach: 3}}}\nagents: {solver: g, checker: g}\n",
    "hf_base_url.yaml": "worker_groups: {g: {model: tiny-random, base_url: 'http://127.0.0.1:1/v1'}}\nagents: {solver: g, checker: g}\n",
    "key_env.yaml": "worker_groups: {g: {model: m, engine: openai, api_key_env: 'not a var'}}\nagents: {solver: g, checker: g}\n",
    "wg_path.yaml": "worker_groups: {'../x': tiny-random}\nagents: {solver: '../x', checker: '../x'}\n",
    "prices_neg.yaml": "models:\n  tiny-random: {input_per_1m: -1}\n",
    "prices_missing.yaml": "models:\n  other-model: {input_per_1m: 1}\n",
    "afile": "x",
}

EVAL = ["eval", "--model", "tiny-random", "--suite", "toy", "--n", "1", "--limit", "1", "--no-progress", "--out", "run"]
TEAM = ["eval", "--suite", "toy", "--n", "1", "--limit", "1", "--no-progress", "--out", "run", "--team"]

# (case id, argv, exit code, text the one error line must hold)
CASES = [
    ("team-not-utf8", TEAM + ["latin1_team.yaml"], 2, "latin1_team.yaml:2: not UTF-8 text"),
    ("prices-not-utf8", EVAL + ["--prices", "latin1_prices.yaml"], 2, "latin1_prices.yaml:3: not UTF-8 text"),
    ("data-not-utf8", ["eval", "--model", "tiny-random", "--benchmarks", "aime24", "--data-dir", "data_latin1", "--n", "1",
                       "--out", "run"], 2, "test.jsonl:1: not UTF-8 text"),
    ("data-answer-list", ["eval", "--model", "tiny-random", "--benchmarks", "nq", "--data-dir", "data_badans", "--n", "1",
                          "--out", "run", "--retriever", "http://127.0.0.1:9"], 2, "test.jsonl:1: cannot read a nq record"),
    ("team-wg-list", TEAM + ["wg_list.yaml"], 2, "wg_list.yaml: worker_groups: must be a mapping, got ['a', 'b']"),
    ("team-agents-list", TEAM + ["agents_list.yaml"], 2, "agents_list.yaml: agents: must be a mapping"),
    ("team-is-list", TEAM + ["team_list.yaml"], 2, "a team file must be a mapping"),
    ("team-bad-yaml", TEAM + ["bad_yaml.yaml"], 2, "bad_yaml.yaml: not valid YAML (line"),
    ("team-sampling-str", TEAM + ["samp_str.yaml"], 2, "samp_str.yaml: sampling.temperature: must be a valid number, got 'hot'"),
    ("team-sampling-top-p", TEAM + ["samp_topp.yaml"], 2, "agents.solver.sampling.top_p: must be greater than 0, got 0"),
    ("team-sampling-tokens", TEAM + ["samp_tokens.yaml"], 2, "sampling.max_new_tokens: must be a valid integer, got 2.5"),
    ("workflow-option-unknown", TEAM + ["wfopt_unknown.yaml"], 2, "unknown option(s) roundz for workflow 'toy'"),
    ("workflow-option-type", TEAM + ["wfopt_type.yaml"], 2, "workflow_options.rounds: expected int"),
    ("workflow-options-list", TEAM + ["wfopt_list.yaml"], 2, "workflow_options: must be a mapping"),
    ("yaml-alias-bomb", TEAM + ["bomb.yaml"], 2, "YAML aliases expand to more than"),
    ("yaml-recursive-alias", TEAM + ["recursive.yaml"], 2, "YAML aliases expand to more than"),
    ("yaml-too-big", TEAM + ["big.yaml"], 2, "big.yaml: team file is"),
    ("engine-option-unknown", TEAM + ["engine_opt.yaml"], 2, "option(s) max_btach not known to the hf engine"),
    ("base-url-on-hf", TEAM + ["hf_base_url.yaml"], 2, "base_url and api_key_env are for engine: openai"),
    ("api-key-env-name", TEAM + ["key_env.yaml"], 2, "worker_groups.g.api_key_env: must name an environment variable"),
    ("wg-name-path", TEAM + ["wg_path.yaml"], 2, "worker group '../x': not a valid name"),
    ("flag-base-url-hf", EVAL + ["--base-url", "http://127.0.0.1:1/v1"], 2, "option(s) base_url not known to the hf engine"),
    ("out-is-file", EVAL[:-1] + ["afile"], 2, "--out afile: exists and is not a directory"),
    ("out-under-file", EVAL[:-1] + ["afile/run"], 2, "--out afile/run: a parent of it is a file"),
    ("limit-negative", EVAL + ["--limit", "-1"], 2, "--limit must be an integer >= 1, got -1"),
    ("limit-zero", EVAL + ["--limit", "0"], 2, "--limit must be an integer >= 1, got 0"),
    ("n-zero", EVAL + ["--n", "0"], 2, "--n must be an integer >= 1, got 0"),
    ("max-new-tokens-zero", EVAL + ["--max-new-tokens", "0"], 2, "--max-new-tokens must be an integer >= 1, got 0"),
    ("temperature-nan", EVAL + ["--temperature", "nan"], 2, "--temperature must be a finite number >= 0, got nan"),
    ("temperature-negative", EVAL + ["--temperature", "-0.1"], 2, "--temperature must be a finite number >= 0"),
    ("top-p-two", EVAL + ["--top-p", "2"], 2, "--top-p must be a number in (0, 1], got 2.0"),
    ("top-p-zero", EVAL + ["--top-p", "0"], 2, "--top-p must be a number in (0, 1], got 0.0"),
    ("concurrency-zero", EVAL + ["--concurrency", "0"], 2, "--concurrency must be an integer >= 1"),
    ("pool-budget-inf", EVAL + ["--pool-budget", "inf"], 2, "--pool-budget must be a number > 0"),
    ("prices-negative", EVAL + ["--prices", "prices_neg.yaml"], 2, "models.tiny-random.input_per_1m: must be greater than or equal to 0"),
    ("prices-missing-model", EVAL + ["--prices", "prices_missing.yaml"], 2, "model 'tiny-random' (worker group 'shared') has no price"),
    ("train-wg-dotdot", ["train", "--recipe", "tiny", "--out", "run", "--set", "agents.solver.wg=../../escape", "--local"],
     2, "agents.solver.wg: worker group '../../escape': not a valid name"),
    ("train-wg-absolute", ["train", "--recipe", "tiny", "--out", "run", "--set", "agents.solver.wg=/tmp/escape", "--local"],
     2, "worker group '/tmp/escape': not a valid name"),
]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    for name, content in FILES.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("argv,code,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_gives_one_line(workdir, capsys, argv, code, expected):
    assert main(list(argv)) == code
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    errors = [line for line in err if line.startswith("drmas-bench: error:")]
    assert len(errors) == 1, err
    assert expected in errors[0], errors[0]
    assert not (workdir / "run" / "config.yaml").exists()  # nothing written before validation passed
    assert not (workdir / "run" / "ckpt").exists()


@pytest.mark.skipif(not Path("/sys").is_dir(), reason="needs a read-only /sys (Linux)")
def test_out_on_read_only_filesystem(tmp_path, capsys, monkeypatch):
    """/sys refuses new folders even to root, so this holds where a chmod'ed folder would not."""
    monkeypatch.chdir(tmp_path)
    assert main(EVAL[:-1] + ["/sys/drmas-bench-test/run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("drmas-bench: error: --out /sys/drmas-bench-test/run: cannot create the run directory")


def test_failed_start_then_corrected_command_is_not_refused(tmp_path):
    """A run dir whose config was written but that holds no finished sample is not a run to protect:
    the corrected command replaces the configuration instead of being refused."""
    from drmas_bench.run_dir import RunDir

    RunDir(tmp_path / "run", {"identity": {"sampling": {"top_p": 0.5}}}).close()
    store = RunDir(tmp_path / "run", {"identity": {"sampling": {"top_p": 0.9}}})
    store.close()
    assert "0.9" in (tmp_path / "run" / "config.yaml").read_text()
