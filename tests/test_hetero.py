"""A heterogeneous team, trained and evaluated (trainer/recipes/tiny_hetero.yaml): the toy workflow's
solver on tiny-random (Qwen2, ChatML, 2,458 tokens) and its checker on tiny-random-llama (Llama,
Llama 3's chat template, 1,536 tokens). Each worker group must keep its own tokenizer end to end:
the rows a group trains on are its own tokenizer's ids (the chat template rendered and encoded by
that tokenizer, the response ids decoding to the text the workflow used), its checkpoint folder holds
its own model and tokenizer, and `eval --model RUN/ckpt/latest` rebuilds the same two models.

The test runs the recipe as CI does (its stored bands), then resumes for a third step and evaluates the
checkpoint, in one process; tests/test_hetero_ray.py does the same with 2 gloo ranks per group as Ray
actors (FSDP2) checkpointing into a ``file://`` URL root. Slow tier.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from drmas_bench.models import resolve_model

RECIPES = Path(__file__).resolve().parent.parent / "trainer" / "recipes"
BANDS = RECIPES / "tiny_hetero_bands.json"
#: worker group -> the alias its model was made from (the recipe's agents.<a>.model)
MODELS = {"solver": "tiny-random", "checker": "tiny-random-llama"}


def _tokenizers() -> dict[str, object]:
    from transformers import AutoTokenizer

    return {wg: AutoTokenizer.from_pretrained(resolve_model(alias)) for wg, alias in MODELS.items()}


def _check_rows(rows: dict[str, list], toks: dict[str, object]) -> None:
    """Every group's rows are its own tokenizer's ids: the prompt is that tokenizer's chat template,
    encoded by it, and the response ids decode (with it) to the text the workflow used; the other
    tokenizer reads them as something else."""
    heads = {"solver": "<|im_start|>system\n", "checker": "<|begin_of_text|><|start_header_id|>system<|end_header_id|>"}
    assert set(rows) == set(MODELS) and all(rows.values())
    for wg, got in rows.items():
        tok, other = toks[wg], toks["checker" if wg == "solver" else "solver"]
        assert {r.agent for r in got} == {wg}
        for r in got:
            prompt = tok.decode(r.prompt_ids)
            assert prompt.startswith(heads[wg]), prompt[:80]
            assert tok(prompt, add_special_tokens=False)["input_ids"] == r.prompt_ids  # encoded by this tokenizer
            assert max(r.prompt_ids + r.response_ids) < len(tok)
            assert tok.decode(r.response_ids, skip_special_tokens=True) == r.text
            assert other(prompt, add_special_tokens=False)["input_ids"] != r.prompt_ids  # ids of this tokenizer only


def _check_checkpoint(step_dir: Path) -> None:
    """team.yaml maps each agent to its own worker group and model folder; each folder holds the
    architecture and the very tokenizer of the model its group started from."""
    team = yaml.safe_load((step_dir / "team.yaml").read_text())
    assert team["agents"] == {"solver": "solver", "checker": "checker"}
    assert team["worker_groups"] == {wg: {"model": f"models/{wg}", "engine": "hf"} for wg in MODELS}
    assert team["trained"]["base_models"] == MODELS
    kinds = {"solver": "qwen2", "checker": "llama"}
    for wg, alias in MODELS.items():
        folder = step_dir / "models" / wg
        assert json.loads((folder / "config.json").read_text())["model_type"] == kinds[wg]
        saved, own = (json.loads((f / "tokenizer.json").read_text()) for f in (folder, Path(resolve_model(alias))))
        for key in ("vocab", "merges"):  # the very vocabulary the group started from
            assert saved["model"][key] == own["model"][key], (wg, key)
        assert saved["added_tokens"] == own["added_tokens"]


def _check_eval(out: Path, toks: dict[str, object]) -> None:
    """The evaluated team is the heterogeneous one: each agent's prompt was counted in its own
    tokenizer's tokens (the two tokenizers count the same messages differently)."""
    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2
    seen = set()
    for s in samples:
        for turn in s["turns"]:
            wg = turn["wg"]
            seen.add(wg)
            msgs = turn["request"]["messages"]
            counts = {name: len(t(t.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False),
                                  add_special_tokens=False)["input_ids"]) for name, t in toks.items()}
            assert counts["solver"] != counts["checker"]
            assert turn["completion"]["prompt_tokens"] == counts[wg], (wg, turn["completion"]["prompt_tokens"], counts)
    assert seen == set(MODELS)


@pytest.mark.slow
def test_tiny_hetero_trains_in_bands_keeps_each_tokenizer_resumes_and_evaluates(tmp_path, monkeypatch):
    """In one process: the recipe as CI runs it (2 RL steps, its bands), the rows each group trained on
    (recorded by wrapping WorkerGroup.score_rows), its checkpoint, a resumed third step, eval."""
    from drmas_bench.cli import main
    from drmas_trainer.worker import WorkerGroup

    rows: dict[str, list] = {}
    score_rows = WorkerGroup.score_rows

    async def recording(self, batch, **kwargs):  # the real method, its rows kept for the checks below
        rows.setdefault(self.name, []).extend(r for r in batch if r.response_ids)
        return await score_rows(self, batch, **kwargs)

    monkeypatch.setattr(WorkerGroup, "score_rows", recording)
    run = tmp_path / "run"
    assert main(["train", "--recipe", "tiny_hetero", "--local", "--out", str(run), "--no-progress"]) == 0
    assert main(["regress", str(run), "--against", str(BANDS)]) == 0
    toks = _tokenizers()
    _check_rows(rows, toks)
    _check_checkpoint(run / "ckpt" / "step_2")

    assert main(["train", "--recipe", "tiny_hetero", "--local", "--steps", "3", "--resume", "--out", str(run),
                 "--no-progress"]) == 0
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    _check_checkpoint(run / "ckpt" / "step_3")
    assert main(["eval", "--model", str(run / "ckpt" / "latest"), "--suite", "toy", "--limit", "2", "--n", "1",
                 "--out", str(tmp_path / "eval"), "--no-progress"]) == 0
    _check_eval(tmp_path / "eval", toks)
