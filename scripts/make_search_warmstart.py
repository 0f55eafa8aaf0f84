"""Remake the committed search warm-start adapter of the demo model ``smollm2-135m-search``.

    python scripts/make_search_warmstart.py --data-dir ../shared/data                 # peft, minutes on 2 CPU cores
    python scripts/make_search_warmstart.py --data-dir ../shared/data --via-trainer   # the trainer's warm start

What it does (issue 21, docs/models.md "smollm2-135m-search"): the supervised examples of the
``search_route`` warm start (`drmas_bench.suites.search.search_sft.search_sft_examples`: the workflow's own prompts on
training-side questions, real BM25 passages of the mini corpus, targets in the protocol's tags) for
the three agents, one LoRA adapter on smollm2-135m-instruct that all three share, trained with the
settings of ``trainer/recipes/search_warmstart.yaml`` (``sft:``, ``agent_defaults.lora``), then saved
in peft's format as bfloat16 safetensors with ``made.json`` (recipe, seed, steps, losses, sha256)
into ``drmas_bench/models/adapters/smollm2-135m-search/``. `drmas-bench models prepare
smollm2-135m-search` merges it into the base; a changed adapter changes the prepared model's hash.

Two ways to train, the same examples and the same loss (token-mean cross-entropy of the targets plus
the end-of-text token, AdamW, gradients clipped at 1, on the tokens of the engines' chat template):

- default: peft directly, here. Only the target positions go through the output layer, the adapter
  sits on layers ``FIRST_LAYER``..29 only, so the lower layers need no backward pass, and the body
  runs in bfloat16 autocast: less CPU time per example than the trainer's warm start (not measured
  side by side here). The committed adapter was made this way (173-188 s on 2 quiet CPU cores; bit-identical when remade).
- ``--via-trainer``: ``drmas-bench train --recipe search_warmstart`` (the trainer's ``sft:`` stage with
  ``lora:``, every layer adapted, float32), then the adapter of its ``ckpt/step_0`` is taken (the
  trainer needs one RL step; its ``step_1`` is not used).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_RECIPE = REPO / "trainer" / "recipes" / "search_warmstart.yaml"
AGENTS = ("verifier", "searcher", "answerer")
FIRST_LAYER = 15  # the peft path adapts layers 15..29 of SmolLM2's 30 (the trainer's lora: has no layer choice)
BASE = "smollm2-135m-instruct"  # what the adapter's config names as its base (an alias, not a machine path)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", help="benchmark data dir with the training-side files (default $DRMAS_DATA_DIR)")
    ap.add_argument("--recipe", default=str(DEFAULT_RECIPE), help="the recipe whose sft: and lora: settings are used")
    ap.add_argument("--out", help="adapter folder (default drmas_bench/models/adapters/smollm2-135m-search)")
    ap.add_argument("--steps", type=int, help="override sft.steps (optimiser steps per agent without an sft.agent_steps entry)")
    ap.add_argument("--via-trainer", action="store_true", help="train with `drmas-bench train --recipe` instead of peft here")
    args = ap.parse_args(argv)
    if args.via_trainer:
        return via_trainer(args)

    import torch
    import yaml
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from drmas_bench.engines.prompt import encode_chat
    from drmas_bench.models import resolve_model
    from drmas_bench.models.smollm2 import SEARCH_ADAPTER, adapter_dir
    from drmas_bench.suites.search.search_sft import search_sft_examples
    from drmas_bench.workflows.base import derive_seed

    recipe = yaml.safe_load(Path(args.recipe).read_text(encoding="utf-8"))
    sft, lora = recipe["sft"], recipe["agent_defaults"]["lora"]
    steps_per_agent = args.steps if args.steps is not None else int(sft["steps"])
    bs, lr, seed = int(sft["batch_size"]), float(sft["lr"]), int(sft.get("seed", 0))
    data_dir = args.data_dir or (recipe.get("data") or {}).get("data_dir") or os.environ.get("DRMAS_DATA_DIR")
    out = Path(args.out) if args.out else adapter_dir(SEARCH_ADAPTER)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))

    t0 = time.perf_counter()
    examples = []
    agent_steps = {a: int((sft.get("agent_steps") or {}).get(a, steps_per_agent)) for a in AGENTS}
    for a in AGENTS:  # as the trainer's warm start: steps x batch examples per agent, each agent its own seed
        examples += search_sft_examples([a], agent_steps[a] * bs, seed=derive_seed(seed, "sft", a), data_dir=data_dir,
                                        workflow_options=recipe.get("workflow_options") or {})
    print(f"[warmstart] {len(examples)} examples in {time.perf_counter() - t0:.0f} s", flush=True)

    base = resolve_model(recipe.get("model", "smollm2-135m-instruct"))
    tok = AutoTokenizer.from_pretrained(base)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    n_layers = model.config.num_hidden_layers
    first = FIRST_LAYER
    cfg = LoraConfig(r=int(lora["rank"]), lora_alpha=float(lora.get("alpha", 2 * int(lora["rank"]))), lora_dropout=0.0,
                     target_modules=list(lora["target_modules"]), layers_to_transform=list(range(first, n_layers)),
                     task_type="CAUSAL_LM")
    model = get_peft_model(model, cfg)
    params = [p for p in model.parameters() if p.requires_grad]
    eos = tok.eos_token_id
    rows = []
    for ex in examples:
        prompt = encode_chat(tok, ex.messages, {"enable_thinking": False}, model="smollm2")
        rows.append((prompt, list(tok(ex.target, add_special_tokens=False)["input_ids"]) + [eos]))
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    inner = model.base_model.model  # the causal LM: its body and output layer, called apart
    rng = random.Random(derive_seed(seed, "sft-order", "shared"))
    order: list[int] = []
    losses: list[float] = []
    total_steps = sum(agent_steps.values())  # one shared adapter: the sum of the agents' steps
    model.train()
    t_train = time.perf_counter()
    for step in range(total_steps):
        if len(order) < bs:
            more = list(range(len(rows)))
            rng.shuffle(more)
            order += more
        idx, order = order[:bs], order[bs:]
        n_tok = sum(len(rows[i][1]) for i in idx)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for i in idx:
            prompt, target = rows[i]
            ids = torch.tensor([prompt + target])
            with torch.autocast("cpu", dtype=torch.bfloat16):
                hidden = inner.model(input_ids=ids).last_hidden_state[:, len(prompt) - 1:-1]
                logits = inner.lm_head(hidden).float()
            nll = torch.nn.functional.cross_entropy(logits[0], torch.tensor(target), reduction="sum") / n_tok
            nll.backward()
            total += float(nll.detach())
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(total)
        print(f"[warmstart] step {step + 1}/{total_steps} loss {total:.3f} ({time.perf_counter() - t_train:.0f} s)", flush=True)

    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    finish(out, {"recipe": Path(args.recipe).stem, "command": "python scripts/make_search_warmstart.py --data-dir ../shared/data",
                 "path": "peft",
                 "seed": seed, "base": recipe.get("model", BASE), "agents": list(AGENTS), "shared_adapter": True,
                 "examples": len(examples), "steps": total_steps, "agent_steps": agent_steps, "batch_size": bs, "lr": lr,
                 "lora": {"rank": cfg.r, "alpha": cfg.lora_alpha, "target_modules": sorted(cfg.target_modules),
                          "layers": [first, n_layers - 1]},
                 "losses": [round(x, 4) for x in losses]}, losses, time.perf_counter() - t_train)
    return 0


def finish(out: Path, made: dict, losses: list[float] | None, train_s: float,
           loss_first_last: tuple[float, float] | None = None) -> None:
    """The adapter folder as committed: weights in bfloat16, the base named by its alias, no peft
    model card (made.json and docs/models.md say what it is), made.json with the losses and hashes."""
    import torch
    from safetensors.torch import load_file, save_file

    from drmas_bench.models.smollm2 import adapter_sha256

    weights = out / "adapter_model.safetensors"
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in load_file(weights).items()}, weights)
    cfg_path = out / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["base_model_name_or_path"] = BASE
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    for extra in ("README.md", "base.json"):
        (out / extra).unlink(missing_ok=True)
    if loss_first_last is None:
        k = max(1, min(10, len(losses) // 5))
        loss_first_last = (sum(losses[:k]) / k, sum(losses[-k:]) / k)
    made = {**made, "loss_first": round(loss_first_last[0], 4), "loss_last": round(loss_first_last[1], 4),
            "train_s": round(train_s), "dtype": "bfloat16",
            "sha256": {f.name: _sha256(f) for f in sorted(out.iterdir()) if f.name.startswith("adapter_")},
            "adapter_sha256": adapter_sha256(out)}
    (out / "made.json").write_text(json.dumps(made, indent=1) + "\n")
    print(f"[warmstart] adapter in {out}: loss {made['loss_first']} -> {made['loss_last']}, {made['train_s']} s", flush=True)


def via_trainer(args: argparse.Namespace) -> int:
    """The recipe through ``drmas-bench train`` into a scratch run dir; its step-0 adapter is kept."""
    import shutil
    import subprocess
    import tempfile

    import yaml

    from drmas_bench.models.smollm2 import SEARCH_ADAPTER, adapter_dir

    recipe = yaml.safe_load(Path(args.recipe).read_text(encoding="utf-8"))
    out = Path(args.out) if args.out else adapter_dir(SEARCH_ADAPTER)
    with tempfile.TemporaryDirectory(prefix="search-warmstart-") as tmp:
        run = Path(tmp) / "run"
        cmd = ["drmas-bench", "train", "--recipe", args.recipe, "--out", str(run), "--fresh", "--no-progress"]
        cmd += ["--data-dir", args.data_dir] if args.data_dir else []
        cmd += ["--set", f"sft.steps={args.steps}"] if args.steps is not None else []
        t0 = time.perf_counter()
        rc = subprocess.run(cmd, check=False).returncode
        if rc != 0:
            print(f"[warmstart] `{' '.join(cmd)}` failed (exit {rc})", file=sys.stderr)
            return rc
        groups = [d for d in (run / "ckpt" / "step_0" / "models").iterdir() if d.is_dir()]
        adapters = [d for g in groups for d in g.iterdir() if (d / "adapter_config.json").is_file()]
        if len(adapters) != 1:
            print(f"[warmstart] expected one adapter in {run}/ckpt/step_0/models, found {len(adapters)}", file=sys.stderr)
            return 1
        info = next(iter(json.loads((run / "sft.json").read_text()).values()))
        out.mkdir(parents=True, exist_ok=True)
        for f in ("adapter_config.json", "adapter_model.safetensors"):
            shutil.copyfile(adapters[0] / f, out / f)
        sft, lora = recipe["sft"], recipe["agent_defaults"]["lora"]
        finish(out, {"recipe": Path(args.recipe).stem, "command": "python scripts/make_search_warmstart.py --via-trainer",
                     "path": "trainer", "seed": int(sft.get("seed", 0)), "base": recipe.get("model", BASE),
                     "agents": list(AGENTS), "shared_adapter": True, "steps": info.get("sft_steps"),
                     "batch_size": int(sft["batch_size"]), "lr": float(sft["lr"]), "lora": lora},
               None, time.perf_counter() - t0, (info["sft_loss_first"], info["sft_loss_last"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
