"""The main path of the CLI commands that the fast tier reached only through their error paths or
through library functions: `models chat` (on tiny-random), `data show` (on the built-in toy suite),
and `train` then `regress` and `eval` of its checkpoint, each in a few seconds. The
audit of every command (docs/testing.md, "Every CLI command in the fast tier") names the fast test
of each of the others."""

from __future__ import annotations

import json

from drmas_bench.cli import main


def test_models_chat_prints_the_models_answer(capsys):
    assert main(["models", "chat", "tiny-random", "What is 3 + 4?", "--max-new-tokens", "4"]) == 0
    out = capsys.readouterr().out
    assert out.strip() and len(out.strip().splitlines()) == 1  # the decoded answer, one line of 4 random tokens
    assert main(["models", "chat", "no-such-model", "hi"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown model 'no-such-model'" in err[0]


def test_data_show_prints_tasks_of_a_benchmark(capsys):
    assert main(["data", "show", "toy", "--n", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("[toy / ") == 2 and "Q: What is " in out and "A: " in out
    assert main(["data", "show", "toy", "--n", "2", "--json"]) == 0
    tasks = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.strip()]
    assert len(tasks) == 2 and all(t["benchmark"] == "toy" and t["answers"] for t in tasks)


def test_train_then_regress_and_eval_its_checkpoint_through_the_cli(tmp_path, capsys):
    """CI's tiny phase in miniature, through `main` as a user types it: one RL step of the tiny
    recipe (a 2-step warm start of batch 8, 1 prompt x 2 episodes), its bands checked, its
    checkpoint evaluated."""
    run = tmp_path / "t"
    assert main(["train", "--recipe", "tiny", "--estimator", "drmas", "--steps", "1", "--local", "--no-progress",
                 "--out", str(run), "--set", "sft.steps=2", "--set", "sft.agent_steps={}", "--set", "sft.batch_size=8",
                 "--set", "rollout.prompts_per_step=1", "--set", "rollout.n=2", "--set", "val.before_train=false",
                 "--set", "val.every=0"]) == 0
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1] and (run / "ckpt" / "latest" / "team.yaml").is_file()
    bands = tmp_path / "bands.json"
    for need, rc in ((1, 0), (2, 1)):  # every step ran; a second one did not
        bands.write_text(json.dumps({"recipe": "tiny", "bands": [
            {"name": "ran every step", "metric": "critic/score/mean", "stat": "count", "min": need}]}))
        assert main(["regress", str(run), "--against", str(bands)]) == rc
    capsys.readouterr()
    out = tmp_path / "e"
    assert main(["eval", "--model", str(run / "ckpt" / "latest"), "--suite", "toy", "--limit", "2", "--n", "1",
                 "--max-new-tokens", "8", "--no-progress", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["run"]["episodes_run"] == 2 and summary["run"]["workflow"] == "toy"
    provenance = json.dumps(summary["provenance"])  # the checkpoint's folder is what was evaluated
    assert str(run.resolve() / "ckpt") in provenance, provenance[:2000]
