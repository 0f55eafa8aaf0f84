"""The step's workload in the trainer's log and ``train --plan --workload RUN`` (drmas_trainer.workload_log),
and the measured hardware row of ``--gpu here`` (drmas_trainer.forecast.hardware_probe).

Trajectories are real `types.Trajectory` objects with random turn counts and token counts; the
expected figures come from a plain loop over them in the test. The eval-run case reads the records
of the real math_refine workflow (scripts/bench_view.py's scripted run, what `drmas-bench eval`
writes). The probe and the plan are checked for their structure, never for a time (the bench script
scripts/bench_plan.py measures).
"""

from __future__ import annotations

import importlib.util
import math
import random
from pathlib import Path

import pytest

from drmas_bench import cli
from drmas_bench.commands.train import plan_recipe
from drmas_bench.types import Completion, Request, Task, Trajectory, Turn, UserError
from drmas_trainer import metric_names as M
from drmas_trainer.config.train import load_config
from drmas_trainer.forecast.hardware_probe import DECODE_ROWS, DecodeCost, decode_cost, probe
from drmas_trainer.runlog import MetricsLog
from drmas_trainer.workload_log import load, measure, step_metrics

ROOT = Path(__file__).resolve().parents[1]
GROUP_OF = {"solver": "solver", "checker": "checker"}


def _trajs(rng: random.Random, n: int) -> list[Trajectory]:
    """Toy-shaped episodes: solver, checker, then (sometimes) a solver retry."""
    out = []
    for i in range(n):
        turns = []
        for pos, agent in enumerate(("solver", "checker", "solver")[: rng.choice((2, 2, 3))]):
            c = Completion(text="x", prompt_tokens=rng.randint(10, 90), completion_tokens=rng.randint(1, 12))
            turns.append(Turn(agent, GROUP_OF[agent], pos, Request(agent, [{"role": "user", "content": "q"}]), c))
        out.append(Trajectory(Task(f"t{i}", "toy", "q", ["1"]), 0, turns))
    return out


def _expected(trajs: list[Trajectory]) -> dict[tuple[int, str], tuple[int, float, float, int]]:
    """(call index, agent) -> (episodes at it, mean prompt, mean response, longest response), by hand."""
    acc: dict[tuple[int, str], list[tuple[int, int]]] = {}
    for t in trajs:
        for pos in range(len(t.turns)):
            c = t.turns[pos].completion
            acc.setdefault((pos, t.turns[pos].agent), []).append((c.prompt_tokens, c.completion_tokens))
    return {k: (len(v), sum(p for p, _ in v) / len(v), sum(r for _, r in v) / len(v), max(r for _, r in v))
            for k, v in acc.items()}


@pytest.mark.parametrize("seed", range(3))
def test_the_step_record_holds_each_calls_workload_and_each_groups_tokens(seed):
    trajs = _trajs(random.Random(seed), 12)
    rec = step_metrics(trajs, GROUP_OF)
    assert rec[M.WL_EPISODES] == 12
    want = _expected(trajs)
    for (i, a), (n, p, r, mx) in want.items():
        assert rec[f"agent/{a}/workload/call{i}/episodes"] == n
        assert rec[f"agent/{a}/workload/call{i}/prompt_length/mean"] == pytest.approx(p)
        assert rec[f"agent/{a}/workload/call{i}/response_length/mean"] == pytest.approx(r)
        assert rec[f"agent/{a}/workload/call{i}/response_length/max"] == mx
    for g in ("solver", "checker"):
        turns = [t.completion for tr in trajs for t in tr.turns if t.wg == g]
        assert rec[f"wg/{g}/workload/prompt_tokens"] == pytest.approx(sum(c.prompt_tokens for c in turns))
        assert rec[f"wg/{g}/workload/response_tokens"] == pytest.approx(sum(c.completion_tokens for c in turns))


def test_a_training_runs_log_reads_back_as_the_mean_of_its_first_steps(tmp_path):
    rng = random.Random(7)
    steps = [_trajs(rng, 8) for _ in range(3)]
    log = MetricsLog(tmp_path)
    for k, trajs in enumerate(steps, 1):
        log.write({"step": k, **step_metrics(trajs, GROUP_OF)})
    log.close()
    wl = load(f"{tmp_path}:2")  # the first two steps
    assert "steps 1-2" in wl.source and str(tmp_path) in wl.source
    per = [_expected(t) for t in steps[:2]]
    for c in wl.calls:
        made = [e[(c.index, c.agent)] for e in per if (c.index, c.agent) in e]
        assert c.episodes == pytest.approx(sum(m[0] for m in made) / 2)  # a step without the call counts 0
        assert c.prompt_tokens == pytest.approx(sum(m[1] for m in made) / len(made))
        assert c.response_max == max(m[3] for m in made)
    assert wl.episodes == 8
    assert [(c.index, c.agent) for c in load(str(tmp_path)).calls] == sorted({k for e in map(_expected, steps) for k in e})


def test_an_eval_runs_records_give_one_steps_workload(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_view", ROOT / "scripts" / "bench_view.py")
    B = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(B)
    run = B.scripted_math_run(tmp_path / "eval", questions=5)
    from drmas_bench.run_dir import read_samples

    recs = read_samples(run / "samples.jsonl")
    wl = load(str(run))
    assert wl.episodes == len(recs) and "samples.jsonl" in wl.source
    by_hand: dict[tuple[int, str], list[int]] = {}
    for r in recs:
        for i, t in enumerate(r["turns"]):
            by_hand.setdefault((i, t["agent"]), []).append(t["completion"]["completion_tokens"])
    assert {(c.index, c.agent): (c.episodes, c.response_max) for c in wl.calls} == \
        {k: (len(v), max(v)) for k, v in by_hand.items()}
    assert measure(recs, "x").calls == wl.calls


@pytest.mark.parametrize("spec, needle", [("{d}/nothing", "neither"), ("{d}/run:0", "must be positive"),
                                          ("{d}/empty", "no step with the workload figures")])
def test_a_workload_that_cannot_be_read_is_one_line(tmp_path, spec, needle):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "metrics.jsonl").write_text('{"step": 0, "timing_s/testing": 1.0}\n')
    with pytest.raises(UserError, match=needle) as e:
        load(spec.format(d=tmp_path))
    assert "\n" not in str(e.value)


def test_the_probe_is_a_measured_row_used_as_it_is():
    hw = probe(seconds=0.02)
    for v in (hw.bf16_flops, hw.hbm_bytes_s, hw.memory_gib):
        assert math.isfinite(v) and v > 0
    assert hw.flops_used == hw.bf16_flops and hw.bytes_used == hw.hbm_bytes_s  # no second discount
    assert "measured" in hw.title and "GFLOP/s" in hw.source


def _log_one_step(run: Path, trajs: list[Trajectory]) -> list[Trajectory]:
    """A run folder whose metrics.jsonl holds one step's workload figures of ``trajs``."""
    log = MetricsLog(run)
    log.write({"step": 1, **step_metrics(trajs, GROUP_OF)})
    log.close()
    return trajs


@pytest.mark.parametrize("dtype, invariant", [("float32", True), ("bfloat16", False)])
def test_the_decode_probe_is_measured_in_the_engines_dtype_and_mode(dtype, invariant):
    import torch

    from drmas_trainer.forecast.shapes import model_shape

    from drmas_bench.engines.invariant import BLOCK

    assert DECODE_ROWS == BLOCK  # the probe's rows are the invariant decode's blocks
    shape = model_shape("tiny-random")
    dc = decode_cost(shape, getattr(torch, dtype), invariant, seconds=0.02)
    assert dc.weight_bytes == {"float32": 4, "bfloat16": 2}[dtype] and dc.invariant == invariant
    assert math.isfinite(dc.weight_bytes_s) and dc.weight_bytes_s > 0
    for v in (*dc.fixed, *dc.per_layer):
        assert math.isfinite(v) and v >= 0
    # the step's other costs go through the two measured points, linearly in the rows
    at = [f + shape.layers * p for f, p in zip(dc.fixed, dc.per_layer)]
    assert dc.step_overhead_s(1, shape.layers) == pytest.approx(max(at[0], 0.0))
    assert dc.step_overhead_s(DECODE_ROWS, shape.layers) == pytest.approx(max(at[1], 0.0))
    assert ("batch-invariant" if invariant else "padded") in dc.source and dtype in dc.source


def test_a_measured_decode_replaces_the_published_terms_as_stated(tmp_path):
    """With a decode cost per group (a made-up one: no measurement), each call's prefill and decode
    and the weight syncs are what the hours model's docstring says, recomputed here by hand."""
    from drmas_trainer.forecast.hours import forward_flops, kv_bytes_per_token, predict

    _log_one_step(tmp_path, _trajs(random.Random(5), 6))
    cfg = load_config("smollm2_toy", {})
    plan, plain = plan_recipe(cfg, gpu="h100", local=True, workload=str(tmp_path))
    dc = DecodeCost(2e9, (1e-3, 4e-3), (2e-4, 5e-4), "made up", weight_bytes=2, invariant=True)
    from drmas_bench.workflows.base import get_workflow
    from drmas_trainer.config.groups import plan_worker_groups
    from drmas_trainer.forecast.shapes import model_shape
    from drmas_trainer.workload_log import load as load_wl

    groups = plan_worker_groups(cfg, get_workflow(cfg.workflow).agents)
    shapes = {g: model_shape(str(p.settings.model)) for g, p in groups.items()}
    wl = load_wl(str(tmp_path)).for_plan(cfg.rollout.max_new_tokens)
    hw = plain.hardware
    est = predict(cfg, groups, shapes, plan, hw, gpu="h100", gpus=1, tasks=None, workload=wl,
                  decode={g: dc for g in groups})
    assert len(est.calls) == len(plain.calls) > 0
    for c, p in zip(est.calls, plain.calls):
        sh = shapes[c.group]
        b, L, r, pr = c.batch, c.longest, c.response, c.prompt
        over = lambda rows: dc.fixed[0] + sh.layers * dc.per_layer[0] + (rows - 1) * (  # noqa: E731
            dc.fixed[1] + sh.layers * dc.per_layer[1] - dc.fixed[0] - sh.layers * dc.per_layer[0]) / (DECODE_ROWS - 1)
        assert c.prefill_s == pytest.approx(p.prefill_s + b * over(1))  # each prompt alone
        blocks = -(-b // dc.rows)
        mem = L * blocks * 2 * sh.params / 2e9 + b * r * (pr + r / 2) * kv_bytes_per_token(sh) / hw.bytes_used
        comp = b * r * 2 * sh.params / hw.flops_used
        assert c.decode_s == pytest.approx(max(mem, comp) + L * over(b * r / L))
        assert forward_flops(sh, 0) == 2 * sh.params
    trainer_bytes = {"float32": 4, "bfloat16": 2}[groups[est.calls[0].group].settings.dtype]
    want_sync = sum((trainer_bytes + 2) * shapes[c.group].params / hw.hbm_bytes_s for c in est.calls if c.wakes)
    assert est.syncs > 0 and est.sync_s == pytest.approx(want_sync)


def test_the_plan_here_predicts_from_the_measured_workload(tmp_path):
    trajs = _log_one_step(tmp_path, _trajs(random.Random(3), 4))
    cfg = load_config("tiny", {})
    _, est = plan_recipe(cfg, gpu="here", local=True, workload=str(tmp_path))
    B = cfg.rollout.prompts_per_step * cfg.rollout.n
    L = cfg.rollout.max_new_tokens
    want = _expected(trajs)
    assert [(c.agent, c.batch, c.prompt, c.longest) for c in est.calls] == [
        (a, pytest.approx(n / 4 * B), pytest.approx(p), min(mx, L)) for (i, a), (n, p, _, mx) in sorted(want.items())]
    assert est.workload.startswith("measured") and str(tmp_path) in est.workload
    assert est.step_s > 0 and est.hours is not None


def test_the_cli_refuses_a_workload_without_plan_and_an_unknown_gpu(capsys):
    assert cli.main(["train", "--recipe", "tiny", "--workload", "runs/x", "--out", "unused"]) == 2
    assert "goes with --plan" in capsys.readouterr().err
    assert cli.main(["train", "--recipe", "tiny", "--plan", "--gpu", "h900"]) == 2
    assert "here (this machine, measured)" in capsys.readouterr().err
