"""`drmas-bench train | regress | plot`: the reference trainer, its regression check and its curves.

The trainer (``drmas_trainer``) is imported inside the command functions only, so the CLI's
``--help`` stays fast and the harness does not depend on the trainer.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from drmas_bench.types import UserError

logger = logging.getLogger(__name__)

TRAIN_EPILOG = """examples:
  drmas-bench train --recipe tiny --estimator drmas --out runs/tiny-drmas       # CPU, a few minutes
  drmas-bench train --recipe tiny --estimator grpo --out runs/tiny-grpo
  drmas-bench train --recipe tiny --estimator drmas --shared --loss gspo --steps 10
  drmas-bench train --recipe tiny --out runs/tiny-drmas --resume                # after a kill
  drmas-bench train --recipe tiny --ray --set ray.num_gpus=2 --steps 2          # worker groups as Ray actors
  drmas-bench train --recipe math_qwen3_4b --ray-address HEAD:6379 --set ckpt_root=/shared/ckpt/run1   # a cluster (docs/scaling.md)
  drmas-bench train --recipe math_qwen3_4b --ray-address HEAD:6379 --set ckpt_root=s3://bucket/run1    # an fsspec URL (needs s3fs)
  drmas-bench train --recipe math_qwen3_4b --set model=tiny-random --set device=cpu \
      --set agent_defaults.engine=hf --set 'agent_defaults.engine_options={}' \
      --set rollout.prompts_per_step=2 --set rollout.n=2 --set rollout.max_new_tokens=16 --set fsdp.ranks=1 \
      --steps 1                                                                 # shrunk, CPU (one process per group)
  drmas-bench train --recipe math_qwen3_4b --estimator drmas --data-dir ../shared/data   # GPU (sglang), DAPO-Math-17k
  drmas-bench train --recipe math_qwen3_4b_1gpu --plan                          # memory plan, exit 1 if it cannot fit
  drmas-bench train --recipe math_qwen3_4b --plan --ray --gpu-memory 80         # the same on 80 GB GPUs
  drmas-bench train --recipe search_qwen2.5_7b --plan --gpu-memory 80           # a paper row on its 8 x H100: memory and hours
  drmas-bench train --recipe math_qwen3_8b --plan --gpus 8 --gpu-memory 141     # the same row on 8 x H200

Recipes: trainer/recipes/*.yaml (tiny; the paper's rows search_qwen2.5_3b[_shared], search_qwen2.5_7b[_shared],
search_hetero_llama3.2_3b_qwen2.5_7b, math_qwen3_4b[_shared], math_qwen3_8b[_shared]; math_qwen3_4b_1gpu,
math_qwen3_1.7b_80gb, ...) or a YAML path. GPU memory and hours: --plan (docs/trainer.md).
Any config key can be overridden with --set SECTION.KEY=VALUE (e.g. --set rollout.n=4).
The run directory gets metrics.jsonl, config.yaml and ckpt/step_K/ (+ ckpt/latest);
`drmas-bench eval --model RUN/ckpt/latest --suite toy` evaluates the trained team,
RUN/ckpt/step_0 is the team before RL (after the warm start).
"""

REGRESS_EPILOG = """examples:
  drmas-bench regress runs/ci-tiny --against trainer/recipes/tiny_bands.json

Bands file (JSON): {"bands": [{"name": ..., "metric": "critic/score/mean", "stat": "last_k_mean", "k": 5, "min": 0.5},
                              {"metric": "agent/*/actor/grad_norm", "stat": "max", "max": 50}, ...]}
stats: last_k_mean, first_k_mean, mean, max, min, last, sum, count (records), nonfinite (NaN/inf values).
Exit 0 when every band holds, 1 with one line per failed band otherwise.
"""

PLOT_EPILOG = """examples:
  drmas-bench plot runs/tiny-drmas                          # -> runs/tiny-drmas/curves.png
  drmas-bench plot runs/tiny-grpo runs/tiny-drmas --out grad_norms.png
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a team with agent-wise GRPO (Dr. MAS) or a baseline", epilog=TRAIN_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default="tiny", help="recipe name (trainer/recipes/NAME.yaml) or a YAML path (default tiny)")
    p.add_argument("--estimator", help="advantage estimator: drmas, grpo, grpo_first_row, global_step, drmas_mean_only, "
                                       "drmas_std_only, grpo_row_score, or a reference name with "
                                       "--set algo.group_by_agent=true|false: agent_agent, traj_traj, agent_traj, "
                                       "traj_agent, auto, master, reference_2025_10 (default: the recipe's; docs/advantages.md)")
    p.add_argument("--loss", choices=["ppo", "gspo"], help="policy loss (default: the recipe's)")
    p.add_argument("--shared", action="store_true", help="agents with the same model share one worker group")
    p.add_argument("--out", help="run directory (default runs/<recipe>-<estimator>[-by_agent|-by_uid][-shared]-s<seed>)")
    p.add_argument("--steps", type=int, help="RL iterations (default: the recipe's)")
    p.add_argument("--seed", type=int, help="run seed (default: the recipe's)")
    p.add_argument("--data-dir", help="benchmark / training-set files (layout of `drmas-bench data list`); "
                                      "sets data.data_dir (default $DRMAS_DATA_DIR, else the hub)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override any config key, e.g. rollout.n=4 (repeatable; every key: `drmas-bench config-schema train`)")
    p.add_argument("--resume", action="store_true", help="continue from the run's latest complete checkpoint")
    p.add_argument("--fresh", action="store_true", help="delete the run directory's checkpoints and metrics first")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--local", action="store_true", help="worker groups in this process (default without a GPU)")
    g.add_argument("--ray", action="store_true", help="worker groups as Ray actors (default with a GPU)")
    p.add_argument("--ray-address", metavar="ADDR",
                   help="--ray: attach to this Ray cluster (auto, host:port, ray://host:port); sets ray.address "
                        "(default $RAY_ADDRESS, else a local Ray is started; docs/scaling.md)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--plan", action="store_true", help="print the per-worker-group GPU memory plan and exit "
                                                       "(exit 1 when it does not fit --gpu-memory); trains nothing")
    p.add_argument("--gpu-memory", type=_positive(float), default=None, metavar="GIB",
                   help="memory of one GPU for --plan, GiB (default: --gpu's, else the recipe's plan.gpu's, else 140: "
                        "an H200)")
    p.add_argument("--gpu", default=None, metavar="NAME",
                   help="--plan's GPU for the predicted hours: h100 | h200 | a100, or here: this machine's CPU, "
                        "measured now by a short matmul and copy probe (default: the recipe's plan.gpu, or the one "
                        "whose memory is nearest --gpu-memory; figures and sources in drmas_trainer.forecast.hardware)")
    p.add_argument("--workload", default=None, metavar="RUN[:K]",
                   help="--plan from the workload measured in RUN instead of the recipe's plan: assumptions: a "
                        "training run (its metrics.jsonl; :K its first K steps) or an eval run of the starting team "
                        "(its samples.jsonl); drmas_trainer.workload_log")
    p.add_argument("--prompt-tokens", type=int, default=None,
                   help="longest prompt of a training row for --plan (default: the recipe's plan.prompt_tokens, else 4096)")
    p.add_argument("--gpus", type=_positive(int), default=None, metavar="N",
                   help="--plan on N GPUs: every group sharded over the N (fsdp.ranks = N, colocated: the "
                        "reference's layout), N / groups ranks each with fsdp.layout=separate, or with N = 1 "
                        "unsharded on the one GPU; the plan says which --set trains the layout it re-planned, "
                        "or refuses naming the setting that fits")
    p.set_defaults(func=cmd_train)

    r = sub.add_parser("regress", help="check a training run's metric curves against stored bands", epilog=REGRESS_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("run", help="run directory (or its metrics.jsonl)")
    r.add_argument("--against", required=True, help="bands JSON file, e.g. trainer/recipes/tiny_bands.json")
    r.set_defaults(func=cmd_regress)

    q = sub.add_parser("plot", help="plot reward and per-agent gradient-norm curves of training runs to PNG",
                       epilog=PLOT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    q.add_argument("runs", nargs="+", help="run directories (several: one figure, one line style per run)")
    q.add_argument("--out", help="PNG path (default RUN/curves.png of the first run)")
    q.add_argument("--title", help="figure title")
    q.set_defaults(func=cmd_plot)


def _positive(kind: type) -> Any:
    """argparse type: a finite number > 0 of ``kind`` (int or float); anything else is argparse's
    one-line error."""
    def parse(text: str) -> Any:
        try:
            v = kind(text)
        except ValueError:
            v = None
        if v is None or not math.isfinite(v) or v <= 0:
            what = "a whole number >= 1" if kind is int else "a number of GiB > 0"
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return v
    return parse


def quiet_loading_bars() -> None:
    """``--no-progress`` for the libraries' bars too ("Loading weights", downloads): off in this
    process, and through the environment in the worker processes it starts (Ray actors)."""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # read by huggingface_hub and transformers at import
    if "huggingface_hub" in sys.modules:
        sys.modules["huggingface_hub"].utils.disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


#: --plan's own flags -> what a training run reads instead (a flag the run cannot honour is refused)
PLAN_ONLY = {"gpus": "--set fsdp.ranks=N (and fsdp.layout)", "gpu_memory": "the GPU it runs on",
             "gpu": "the GPU it runs on", "prompt_tokens": "the data's own prompts"}


def _refuse_plan_flags(args: argparse.Namespace) -> None:
    for name, instead in PLAN_ONLY.items():
        if getattr(args, name, None) is not None:
            flag = "--" + name.replace("_", "-")
            raise UserError(f"{flag} is a --plan flag (training reads {instead}); add --plan, or drop {flag}")


def cmd_train(args: argparse.Namespace) -> int:
    if getattr(args, "no_progress", False):
        quiet_loading_bars()
    from drmas_trainer.config.train import load_config, parse_override
    from drmas_trainer.trainer import train

    overrides = dict(parse_override(s) for s in args.set)
    if args.estimator:
        overrides["algo.estimator"] = args.estimator
    if args.loss:
        overrides["algo.loss"] = args.loss
    if args.shared:
        overrides["shared"] = True
    if args.steps is not None:
        overrides["steps"] = args.steps
        overrides["epochs"] = None
    if args.seed is not None:
        overrides["seed"] = args.seed
    if getattr(args, "data_dir", None):
        overrides["data.data_dir"] = args.data_dir
    if getattr(args, "ray_address", None):
        if args.local:
            raise UserError("--ray-address is for --ray (got --local)")
        overrides["ray.address"] = args.ray_address
    if getattr(args, "workload", None) and not getattr(args, "plan", False):
        raise UserError("--workload RUN re-predicts a plan: it goes with --plan (it trains nothing)")
    cfg = load_config(args.recipe, overrides)
    if getattr(args, "plan", False):
        return cmd_plan(cfg, args)
    _refuse_plan_flags(args)
    index = {None: "", True: "-by_agent", False: "-by_uid"}[cfg.algo.group_by_agent]  # a reference name's index
    name = f"{cfg.recipe}-{cfg.algo.estimator}{index}{'-shared' if cfg.shared else ''}-s{cfg.seed}"
    out = Path(args.out or Path("runs") / name)
    if args.fresh and args.resume:
        raise UserError("--fresh and --resume exclude each other")
    use_ray = True if args.ray or getattr(args, "ray_address", None) else False if args.local else None
    logger.info(f"[train] recipe {cfg.recipe}, estimator {cfg.algo.estimator}, loss {cfg.algo.loss}, "
                f"{'shared' if cfg.shared else 'shared base, an adapter per agent' if cfg.shared_base else 'non-shared'}, "
                f"run dir {out}")
    before = _resume_hint(out, cfg) if out.exists() else None  # a refusal at load leaves it as it is
    t0 = time.perf_counter()
    try:  # --fresh deletes the old run inside train(), under the run dir's lock
        summary = train(cfg, out, resume=args.resume, fresh=args.fresh, use_ray=use_ray, progress=not args.no_progress)
        summary["wall_s"] = time.perf_counter() - t0  # time_s is the RL steps' own; this, the whole call
    except UserError as e:  # refused mid-run, after a checkpoint of this call: say how to continue it
        hint = _resume_hint(out, cfg)
        if hint is None or hint == before:
            raise
        raise UserError(f"{e}; {hint}: drmas-bench train {' '.join(_resume_argv(args))}") from None
    except KeyboardInterrupt:
        raise
    except Exception as e:  # train() has written the traceback to RUN/error.log
        from drmas_bench.log import unexpected

        raise unexpected(e, "training stopped", log=getattr(e, "traceback_log", out / "error.log"),
                         hint=_resume_hint(out, cfg) or "") from None
    _report(summary, out, cfg)
    return 0


def _report(summary: dict[str, Any], out: Path, cfg: Any) -> None:
    """A finished run's JSON summary line and its closing log lines."""
    from drmas_trainer.checkpoint import latest_pointer, resolve_root

    print(json.dumps({k: v for k, v in summary.items() if k != "grad_norm_spread"}))
    root = resolve_root(out, cfg.ckpt_root)
    spread = summary.get("grad_norm_spread", {})
    if spread:
        logger.info("[train] grad-norm spread (max/median over steps): " + ", ".join(
            f"{a} {s['spread']:.2f}" if "spread" in s else f"{a} none (median norm {s['median']:g})"
            for a, s in spread.items()))
    k = summary.get("reward_window", 5)
    logger.info(f"[train] reward first {k} step(s) {summary['reward_first5']:.3f} -> last {k} "
                f"{summary['reward_last5']:.3f}; checkpoints in {root} (latest: {latest_pointer(root)})")
    if summary.get("wall_s") is not None:
        logger.info(f"[train] wall {summary['wall_s']:.0f} s from start-up; the RL steps' own {summary['time_s']:.1f} s "
                    f"(time_s); the rest: start-up, warm start, validation, checkpoints")
    best = summary.get("val_best")
    if best:
        logger.info(f"[train] best validation: step {best['step']}, {best['metric']} {best['value']:.4g} "
                    f"({out / best['run']})")


def plan_recipe(cfg: Any, *, gpu: str | None = None, gpu_gib: float | None = None, gpus: int | None = None,
                prompt_tokens: int | None = None, local: bool = False, workload: str | None = None) -> tuple[Any, Any]:
    """(memory plan, hours estimate) of ``cfg`` as ``train --plan`` makes them: the hardware is
    ``gpu`` (a row of drmas_trainer.forecast.hardware.HARDWARE), else the one ``gpu_gib`` suggests,
    else the recipe's ``plan.gpu``, else an H200 at 140 GiB; ``gpus``: the recipe re-planned on that
    many GPUs or refused (drmas_trainer.forecast.gpus; default its fsdp section); ``prompt_tokens``:
    the flag (default ``plan.prompt_tokens``, else 4096); ``local``: every group in one process on one
    GPU (else Ray actors); ``workload``: --workload's RUN[:K] (drmas_trainer.workload_log), else the
    estimate carries the range of the recipe's stated bounds."""
    from drmas_bench.workflows.base import get_workflow
    from drmas_trainer.config.groups import plan_worker_groups
    from drmas_trainer.forecast.gpus import gpu_layout
    from drmas_trainer.forecast.hours import HARDWARE, hardware_for, predict, training_prompts
    from drmas_trainer.forecast.memory import DEFAULT_GPU_GIB, memory_plan
    from drmas_trainer.forecast.shapes import model_shape
    from drmas_trainer.forecast.workload import stated
    from drmas_trainer.workload_log import load as load_workload

    if gpu is not None and gpu not in HARDWARE and gpu != "here":
        raise UserError(f"--gpu: unknown GPU {gpu!r}; known: {', '.join(HARDWARE)}, here (this machine, measured)")
    wl = load_workload(workload).for_plan(cfg.rollout.max_new_tokens) if workload else None
    if gpu_gib is not None and not (math.isfinite(gpu_gib) and gpu_gib > 0):
        raise UserError(f"--gpu-memory must be a number of GiB > 0, got {gpu_gib:g}")
    groups = plan_worker_groups(cfg, get_workflow(cfg.workflow).agents)
    layout = gpu_layout(cfg, len(groups), gpus, local=local)
    cfg = layout.apply(cfg)
    shapes = {}
    for name, g in groups.items():
        try:
            shapes[name] = model_shape(str(g.settings.model))
        except ValueError as e:
            raise UserError(f"--plan: worker group {name}: {e}") from None
    gpu_why = "--gpu" if gpu else "the recipe's plan.gpu" if gpu_gib is None and cfg.plan.gpu else \
        "nearest --gpu-memory" if gpu_gib is not None else "default"
    if gpu is None and gpu_gib is None:
        gpu = cfg.plan.gpu
    if gpu == "here":  # this machine, measured now with the run's thread count
        from drmas_trainer.forecast.hardware_probe import probe

        name, hw = gpu, probe(threads=cfg.torch_threads)
    else:
        name, hw = hardware_for(gpu, gpu_gib)
    gib = gpu_gib or (hw.memory_gib if gpu else DEFAULT_GPU_GIB)
    prompt_why = "--prompt-tokens" if prompt_tokens else "the recipe's plan.prompt_tokens" if cfg.plan.prompt_tokens \
        else "default: neither --prompt-tokens nor plan.prompt_tokens says; a short-prompt recipe's memory is less"
    plan = memory_plan(cfg, groups, shapes, gpu_gib=gib, use_ray=not local,
                       prompt_tokens=prompt_tokens or cfg.plan.prompt_tokens or 4096)
    plan.prompt_source = prompt_why
    plan.memory_source = "--gpu-memory" if gpu_gib else f"{gpu_why}: {name}" if gpu else "default: an H200"
    tasks, why = training_prompts(cfg)
    decode = _decode_here(cfg, groups, shapes) if gpu == "here" else None
    est = predict(cfg, groups, shapes, plan, hw, gpu=name, gpus=plan.n_gpus, tasks=tasks, tasks_why=why, workload=wl,
                  decode=decode)
    est.sources = {"GPU": gpu_why, "GPUs": layout.note or "the recipe's fsdp and ray sections"}
    if wl is not None:  # one figure, from the run measured
        return plan, est
    agents = [a for g in groups.values() for a in g.agents]

    def hours(end: Any, early: Any = None) -> Any:
        return predict(cfg, groups, shapes, plan, hw, gpu=name, gpus=plan.n_gpus, tasks=tasks, tasks_why=why,
                       workload=stated(cfg, agents, end, early=early), decode=decode).hours

    est.low_hours, est.high_hours = hours("low"), hours("high")
    if est.hours is not None:
        est.parts = {"the longest response": (hours("low", "point"), hours("high", "point")),
                     "early stopping": (hours("point", "low"), hours("point", "high"))}
    return plan, est


def _decode_here(cfg: Any, groups: dict[str, Any], shapes: dict[str, Any]) -> dict[str, Any]:
    """Per worker group whose engine is ``hf``: its decode on this machine, measured now in the
    engine's dtype and decode mode (drmas_trainer.forecast.hardware_probe.decode_cost), once per
    distinct (family and vocabulary, dtype, mode)."""
    import torch

    from drmas_bench.engines import engine_class
    from drmas_bench.engines.hf import HFEngine
    from drmas_trainer.forecast.hardware_probe import decode_cost

    out: dict[str, Any] = {}
    seen: dict[tuple, Any] = {}
    for g, plan in groups.items():
        if not issubclass(engine_class(plan.settings.engine), HFEngine):  # the decode the probe knows
            continue
        opts = HFEngine.resolved_options({**plan.settings.engine_options, "device": "cpu"})
        sh = shapes[g]
        key = (sh.qk_norm, sh.qkv_bias, sh.vocab, opts["dtype"], bool(opts.get("batch_invariant", True)))
        if key not in seen:
            seen[key] = decode_cost(sh, getattr(torch, opts["dtype"]), key[-1], threads=cfg.torch_threads)
        out[g] = seen[key]
    return out


def cmd_plan(cfg: Any, args: argparse.Namespace) -> int:
    """``train --plan``: the memory plan of the recipe's worker groups (drmas_trainer.forecast.memory)
    and the predicted hours with validation and their range (drmas_trainer.forecast.hours), on the
    flags' hardware or the recipe's ``plan:`` section."""
    from drmas_trainer.forecast.hours import format_hours
    from drmas_trainer.forecast.memory import format_plan, why_not

    plan, est = plan_recipe(cfg, gpu=getattr(args, "gpu", None), gpu_gib=args.gpu_memory, gpus=getattr(args, "gpus", None),
                            prompt_tokens=getattr(args, "prompt_tokens", None), local=args.local,
                            workload=getattr(args, "workload", None))
    print(format_plan(plan, cfg.recipe))
    print(format_hours(est))
    if not plan.fits:
        pk = plan.peak
        head = f"why: {pk.phase} on GPU {pk.gpu}"
        reason = next((ln.removeprefix(head).lstrip(" =:") for ln in why_not(plan) if ln.startswith(head)), "")
        logger.warning(f"plan: does not fit: {pk.phase} on GPU {pk.gpu} needs {pk.bytes / 2**30:.1f} GiB > "
                       f"{plan.gpu_bytes / 2**30:.0f} GiB ({plan.memory_source})" + (f"; {reason}" if reason else ""))
        return 1
    return 0


def cmd_regress(args: argparse.Namespace) -> int:
    from drmas_trainer.reports.regress import check_run

    failures, lines = check_run(args.run, args.against)
    for line in lines:
        print(line)
    if failures:
        for f in failures:
            logger.warning(f"regression: {f}")
        return 1
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from drmas_trainer.reports.plot import plot_runs

    out = Path(args.out) if args.out else Path(args.runs[0]) / "curves.png"
    path, spread = plot_runs(args.runs, out, title=args.title)
    for run, per_agent in spread.items():
        for agent, s in per_agent.items():
            if "spread" in s:
                print(f"{run}\tagent/{agent}/actor/grad_norm\tmax {s['max']:.4g}\tmedian {s['median']:.4g}\tspread {s['spread']:.2f}")
            if "factor" in s:
                print(f"{run}\tagent/{agent}/critic/moment_factor/mean\tmean {s['factor']:.4g}")
    logger.info(f"[plot] wrote {path}")
    return 0


def _resume_argv(args: argparse.Namespace) -> list[str]:
    """The command line that continues this run: the same flags, with --resume (and without --fresh)."""
    argv = [a for a in (getattr(args, "argv", None) or [])[1:] if a not in ("--fresh", "--resume")]
    return [*argv[1:], "--resume"] if argv[:1] == ["train"] else [*argv, "--resume"]


def _resume_hint(out: Path, cfg) -> str | None:
    """The --resume hint of a failed run, only when a complete checkpoint exists to resume from
    (a run that fails before its first checkpoint would be told to resume from nothing)."""
    from drmas_trainer.checkpoint import latest_checkpoint, resolve_root

    try:
        found = latest_checkpoint(resolve_root(out, cfg.ckpt_root))
    except Exception:  # an unreachable ckpt_root: no claim either way
        return None
    return f"--resume continues from the last complete checkpoint (step {found[0]})" if found else None
