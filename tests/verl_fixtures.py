"""Reference-format (verl FSDP) checkpoints made by real sharding on CPU, for the merge tests.

:func:`build` writes, under one folder:

- ``originals/<name>/``: Hugging Face folders of ``tiny-random`` with each agent's own weights
  (seeded noise added, so an agent given another's weights is seen), one of them in bfloat16;
- ``<case>/`` reference roots, each saved by two ``torch.distributed`` gloo processes exactly as
  the reference trainer saves (``torch.save`` of each rank's sharded state dict as
  ``actor/<wg_id>/model_world_size_2_rank_R.pt``, config and tokenizer from rank 0, the
  ``latest_checkpointed_iteration.txt`` tracker, ``data.pt``; where the config is in
  ``huggingface/``, also the ``fsdp_config.json`` that newer verl writes):

  ============== ======================================== ============================================
  case           worker groups (wg_id naming)             sharding
  ============== ======================================== ============================================
  math_split     Solver, Verifier (not shared)            FSDP2 fully_shard, (fsdp) mesh; config beside
  math_shared    SolverAgent_VerifierAgent (shared)       FSDP1 sharded state dict; config in huggingface/
  search_split   Verifier, Search, Answer (not shared)    FSDP2 over a (ddp=1, fsdp=2) mesh; one bf16
  search_shared  VerifierAgent_SearchAgent_AnswerAgent    FSDP2 over a (ddp=2, fsdp=1) mesh (replicas)
  math_lora      Solver, Verifier, each with LoRA         FSDP2 of the peft model + lora_adapter/
  ============== ======================================== ============================================

``python tests/verl_fixtures.py OUT`` builds them by hand.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

MODEL = "tiny-random"
CASES = {
    "math_split": {"groups": {"tiny-random_Solver Agent": "solver", "tiny-random_Verifier Agent": "verifier"},
                   "how": "fsdp2", "config": "beside"},
    "math_shared": {"groups": {"tiny-random_SolverAgent_VerifierAgent": "shared_math"}, "how": "fsdp1",
                    "config": "huggingface"},
    "search_split": {"groups": {"tiny-random_Verifier Agent": "s_verifier", "tiny-random_Search Agent": "s_searcher",
                                "tiny-random_Answer Agent": "s_answerer"}, "how": "hsdp12", "config": "huggingface"},
    "search_shared": {"groups": {"tiny-random_VerifierAgent_SearchAgent_AnswerAgent": "shared_search"},
                      "how": "hsdp21", "config": "beside"},
    "math_lora": {"groups": {"tiny-random_Solver Agent": "solver", "tiny-random_Verifier Agent": "verifier"},
                  "how": "fsdp2", "config": "huggingface", "lora": True},
}
ORIGINALS = {"solver": 1, "verifier": 2, "shared_math": 3, "s_verifier": 4, "s_searcher": 5, "s_answerer": 6,
             "shared_search": 7}
BF16 = {"s_searcher"}
STEP = 3
LORA = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"], "lora_dropout": 0.0}


def make_originals(out: Path) -> dict[str, Path]:
    """Each original: tiny-random plus seeded noise (bf16 for those in BF16), saved with its tokenizer."""
    import torch

    from drmas_bench.models import resolve_model
    from drmas_bench.models.loading import load_causal_lm

    base = Path(resolve_model(MODEL))
    made = {}
    for name, seed in ORIGINALS.items():
        dest = out / "originals" / name
        model = load_causal_lm(str(base))
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.05)
        if name in BF16:
            model = model.to(torch.bfloat16)
        model.save_pretrained(dest)
        for f in base.iterdir():
            if f.is_file() and (f.name.startswith("tokenizer") or f.name.endswith(".jinja")):
                shutil.copyfile(f, dest / f.name)
        made[name] = dest
    return made


def _save_group(rank: int, ws: int, how: str, src: Path, folder: Path, config: str, lora: bool, seed: int) -> None:
    """One worker group saved as the reference saves it (module docstring)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from drmas_bench.models.loading import load_causal_lm

    model = load_causal_lm(str(src))
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(**LORA))
        g = torch.Generator().manual_seed(100 + seed)
        with torch.no_grad():  # trained-looking adapters (lora_B starts at zero)
            for n, p in model.named_parameters():
                if "lora_" in n:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    if how == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import ShardedStateDictConfig, StateDictType

        mesh = init_device_mesh("cpu", (ws,), mesh_dim_names=("fsdp",))
        wrapped = FSDP(model, device_mesh=mesh, use_orig_params=True, device_id=torch.device("cpu"))
        with FSDP.state_dict_type(wrapped, StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig()):
            sd = wrapped.state_dict()
    else:
        from torch.distributed.fsdp import fully_shard

        shape, names = {"fsdp2": ((ws,), ("fsdp",)), "hsdp12": ((1, ws), ("ddp", "fsdp")),
                        "hsdp21": ((ws, 1), ("ddp", "fsdp"))}[how]
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
        inner = model.base_model.model if lora else model
        for layer in inner.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        sd = model.state_dict()
    full = None
    if lora:  # the adapter is saved from full tensors (gathering is a collective: every rank takes part)
        full = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v) for k, v in sd.items()}
    if rank == 0:
        folder.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    torch.save(sd, folder / f"model_world_size_{ws}_rank_{rank}.pt")
    torch.save({"state": {}, "param_groups": []}, folder / f"optim_world_size_{ws}_rank_{rank}.pt")
    torch.save({"lr_scheduler": None, "rng": {"cpu": torch.get_rng_state()}},
               folder / f"extra_state_world_size_{ws}_rank_{rank}.pt")
    if rank == 0:
        where = folder / "huggingface" if config == "huggingface" else folder
        if config == "huggingface":  # the newer verl layout also records the FSDP version and world size
            (folder / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 1 if how == "fsdp1" else 2,
                                                                 "world_size": ws}, indent=4))
        where.mkdir(parents=True, exist_ok=True)
        for f in src.iterdir():
            if f.is_file() and not f.name.endswith(".safetensors"):
                shutil.copyfile(f, where / f.name)
        if lora:
            from peft.utils.save_and_load import get_peft_model_state_dict
            from safetensors.torch import save_file

            ad = get_peft_model_state_dict(model, state_dict=full)
            (folder / "lora_adapter").mkdir()
            save_file({k: v.detach().contiguous() for k, v in ad.items()}, folder / "lora_adapter" / "adapter_model.safetensors")
            cfg = model.peft_config["default"].to_dict()
            cfg["target_modules"] = sorted(cfg["target_modules"])
            cfg["base_model_name_or_path"] = str(src)
            (folder / "lora_adapter" / "adapter_config.json").write_text(json.dumps(cfg, indent=4, default=str))
    dist.barrier()


def _worker(rank: int, ws: int, out: str, originals: dict[str, str]) -> None:
    import torch
    import torch.distributed as dist

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/.pg", rank=rank, world_size=ws)
    try:
        for case, spec in CASES.items():
            step = Path(out) / case / f"global_step_{STEP}"
            for wg_id, orig in spec["groups"].items():
                _save_group(rank, ws, spec["how"], Path(originals[orig]), step / "actor" / wg_id, spec["config"],
                            bool(spec.get("lora")), ORIGINALS[orig])
            if rank == 0:
                torch.save({"dataloader": 0}, step / "data.pt")
                (Path(out) / case / "latest_checkpointed_iteration.txt").write_text(str(STEP))
            dist.barrier()
    finally:
        dist.destroy_process_group()


def build(out: str | os.PathLike) -> Path:
    """Write every case (module docstring) under ``out``; returns ``out``."""
    import torch.multiprocessing as mp

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    originals = {k: str(v) for k, v in make_originals(out).items()}
    mp.spawn(_worker, args=(2, str(out), originals), nprocs=2, join=True)
    (out / ".pg").unlink(missing_ok=True)
    return out


if __name__ == "__main__":
    print(build(sys.argv[1]))
