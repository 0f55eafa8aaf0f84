"""A checkpoint carries its engine settings: the trainer writes the engine options
that shape numbers into ``team.yaml`` (drmas_bench.engines.carried), ``eval --model CKPT`` uses them
under the user's flags and says so in one line, a team.yaml inside a model folder may carry nothing
else (values checked), and an old team.yaml without them keeps the engine's defaults. End to end, the
validation of a saved step equals a plain eval of it (tests/test_validation.py); slow here: the tiny
recipe's step-1 and step-2 metrics do not depend on the rollout engines' micro-batch."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import yaml

from drmas_bench.agents.team import build_team
from drmas_bench.api import EvalConfig, resolve
from drmas_bench.types import UserError

AGENTS = ("solver", "checker")
# the options a checkpoint may carry, as docs/trainer.md declares them
DECLARED = {"dtype", "batch_invariant", "deterministic", "chat_template_kwargs", "eos_token_ids"}


def _recipe(name: str) -> dict:
    import drmas_trainer

    return yaml.safe_load((Path(drmas_trainer.__file__).parent / "recipes" / f"{name}.yaml").read_text())


def _ckpt(tmp_path, options: dict | None, name: str = "ck"):
    ck = tmp_path / name
    ck.mkdir()
    g = {"model": "tiny-random", **({"options": options} if options is not None else {})}
    (ck / "team.yaml").write_text(yaml.safe_dump({"workflow": "toy", "worker_groups": {"g": g},
                                                  "agents": {"solver": "g", "checker": "g"}}))
    return ck


# ------------------------------------------------------------------------------- the trainer writes them


@pytest.mark.parametrize("recipe,overrides,dtype", [
    ("tiny", {}, None),  # the recipe's engine_options.dtype (bf16 engines, fp32 trainer)
    ("tiny_hetero", {}, None),
    ("tiny", {"agent_defaults.engine_options": {"max_batch": 8}, "agent_defaults.dtype": "bfloat16"}, "bfloat16"),
    ("tiny", {"agent_defaults.engine_options": {"max_batch": 8}}, "float32"),  # no engine dtype: the trainer's
    ("tiny_lora", {}, "float32"),  # LoRA adapters on hf, the trainer's default dtype
    ("math_qwen3_4b", {}, "bfloat16"),  # sglang engines at the recipe's compute dtype
])
def test_checkpoint_team_yaml_carries_the_engines_dtype(recipe, overrides, dtype):
    from drmas_bench.workflows import get_workflow
    from drmas_trainer.config.groups import plan_worker_groups
    from drmas_trainer.config.train import load_config
    from drmas_trainer.saving import checkpoint_team

    wf = get_workflow("toy")
    cfg = load_config(recipe, overrides)
    team = checkpoint_team(cfg, plan_worker_groups(cfg, wf.agents), wf, step=1)
    want = dtype or _recipe(recipe)["agent_defaults"]["engine_options"]["dtype"]
    for g in team["worker_groups"].values():
        assert g["options"]["dtype"] == want
        assert set(g["options"]) <= DECLARED  # never max_batch, device, memory settings: the machine's


# ------------------------------------------------------------------------------- eval reads them


def test_eval_uses_the_checkpoints_options_unless_a_flag_overrides(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="drmas_bench")
    ck = _ckpt(tmp_path, {"dtype": "bfloat16"})
    r = resolve(EvalConfig(model=str(ck), suite="toy"))
    assert r.team.worker_groups["g"].options == {"dtype": "bfloat16"}
    assert caplog.messages[-1] == "[eval] engine options from the checkpoint: dtype=bfloat16"
    r = resolve(EvalConfig(model=str(ck), suite="toy", engine_args={"dtype": "float32"}))
    assert r.team.worker_groups["g"].options == {"dtype": "float32"}  # the flag wins, and the line says so
    assert caplog.messages[-1] == ("[eval] engine options from the checkpoint: dtype=bfloat16 "
                                   "(your flags changed: dtype=float32)")
    # a team.yaml of before (no options): today's behaviour, the engine's defaults, said in one line
    old = _ckpt(tmp_path, None, "old")
    assert resolve(EvalConfig(model=str(old), suite="toy")).team.worker_groups["g"].options == {}
    assert "the checkpoint records none" in caplog.messages[-1]


def test_hetero_groups_are_named_where_they_differ(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="drmas_bench")
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "team.yaml").write_text(yaml.safe_dump({
        "workflow": "toy", "agents": {"solver": "a", "checker": "b"},
        "worker_groups": {"a": {"model": "tiny-random", "options": {"dtype": "bfloat16"}},
                          "b": {"model": "tiny-random", "options": {"dtype": "float32"}}}}))
    build_team("toy", AGENTS, model=str(ck))
    assert caplog.messages[-1] == "[eval] engine options from the checkpoint: a: dtype=bfloat16; b: dtype=float32"


REFUSED = [  # (the options of a checkpoint's worker group, what the one-line refusal must say)
    ({"max_batch": 4}, "sets options.max_batch, which a team.yaml inside a model folder may not set"),
    ({"device": "cuda:7"}, "sets options.device"),
    ({"dtype": "float64"}, "options.dtype must be auto, float32, bfloat16 or float16, got 'float64'"),
    ({"dtype": ["bfloat16"]}, "options.dtype must be"),
    ({"batch_invariant": "yes"}, "options.batch_invariant must be true or false"),
    ({"chat_template_kwargs": {"a": {"b": 1}}}, "options.chat_template_kwargs must be a mapping of names to plain"),
    ({"eos_token_ids": [2, -1]}, "options.eos_token_ids must be a list of token ids"),
    ({"eos_token_ids": [True]}, "options.eos_token_ids must be a list of token ids"),
]


@pytest.mark.parametrize("options,says", REFUSED)
def test_a_checkpoints_options_are_data(tmp_path, options, says):
    """Values from a checkpoint folder are data: only the carried names, each with a valid value;
    anything else is one line naming the file, before any model loads. The same file passed with
    --team is the user's own and is trusted as a flag (its unknown names are the engine's check)."""
    ck = _ckpt(tmp_path, options)
    with pytest.raises(UserError) as e:
        build_team("toy", AGENTS, model=str(ck))
    msg = str(e.value)
    assert says in msg and str(ck / "team.yaml") in msg and "\n" not in msg
    if "device" in options or "max_batch" in options:
        assert build_team("toy", AGENTS, team_file=str(ck / "team.yaml")).worker_groups["g"].options == options


def test_accepted_values(tmp_path):
    opts = {"dtype": "float16", "chat_template_kwargs": {"enable_x": True, "n": 2}, "eos_token_ids": [0, 3]}
    assert build_team("toy", AGENTS, model=str(_ckpt(tmp_path, opts))).worker_groups["g"].options == opts


# ------------------------------------------------------------------------------- the trainer's micro-batch

MICRO = ["sft.steps=10", "sft.agent_steps={checker: 4}", "sft.batch_size=8", "rollout.prompts_per_step=4",
         "rollout.n=4", "data.size=40", "agent_defaults.micro_batch_size=16", "save_every=0", "val.every=0",
         "val.before_train=false"]


CLOCKS = ("timing_s", "cpu_s")  # wall and CPU seconds: what a re-run may change


def _metrics(run) -> list[dict]:
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not any(c in k for c in CLOCKS)} for r in recs]


@pytest.mark.slow
def test_trainer_metrics_do_not_depend_on_the_rollout_micro_batch(tmp_path):
    """The tiny recipe (bf16 rollout engines) for 2 steps, 16 episodes in flight, with the engines'
    micro-batch (``engine_options.max_batch``) at 4 and at 16: the step-1 and step-2 metrics are the
    same, every one of them (clock fields aside)."""
    from drmas_bench.cli import main

    runs = {}
    for mb in (4, 16):
        run = tmp_path / f"mb{mb}"
        args = ["train", "--recipe", "tiny", "--local", "--steps", "2", "--no-progress", "--out", str(run),
                "--set", f"agent_defaults.engine_options={{max_batch: {mb}, dtype: bfloat16}}"]
        for s in MICRO:
            args += ["--set", s]
        assert main(args) == 0
        runs[mb] = _metrics(run)
    assert [r["step"] for r in runs[4]] == [1, 2]
    for a, b in zip(runs[4], runs[16]):
        assert set(a) == set(b)
        assert {k: (a[k], b[k]) for k in a if a[k] != b[k]} == {}
