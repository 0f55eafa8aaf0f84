"""The main path of the CLI commands that the fast tier reached only through their error paths:
`models chat` (on tiny-random) and `data show` (on the built-in toy suite), in a few seconds. The
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
