"""Merge time and peak memory for a reference (verl FSDP) checkpoint: ours vs an in-memory baseline.

Builds a 3-worker-group checkpoint of random weights in the Qwen2.5-0.5B shape (bf16) by real
sharding (two gloo processes, FSDP2 ``fully_shard`` on the meta device, each rank filling its own
shards), then merges it, each merger in a fresh process:

- **ours**: ``drmas_bench.checkpoints.verl.team_folder`` (mmap'd shards, one tensor at a time, a
  streamed safetensors file);
- **baseline**: the method of the reference's ``scripts/model_merger.py``: every shard loaded into
  memory, the whole state dict assembled, then written with ``safetensors.torch.save_file``;
- **verl** (``--verl-python PY``): the PyPI ``verl`` package's own merger run with interpreter ``PY``
  (a venv where it imports), on the same shards, one worker group at a time.

Reported per merger: wall seconds, peak RSS (VmHWM) and peak anonymous memory (RssAnon sampled
every 20 ms: the file-backed pages of mmap'd shards are reclaimable, anonymous ones are not), and
whether the merged tensors are equal. ``--layers N`` shrinks the model for a quick run.

    python scripts/bench_verl_merge.py --out /tmp/bench_verl            # 3 x 0.5B shape
    python scripts/bench_verl_merge.py --out /tmp/bench_verl --layers 4 # smaller
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

GROUPS = ("Qwen2.5-0.5B_Verifier Agent", "Qwen2.5-0.5B_Search Agent", "Qwen2.5-0.5B_Answer Agent")
SHAPE = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=896, intermediate_size=4864,
             num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
             max_position_embeddings=32768, tie_word_embeddings=True, rms_norm_eps=1e-6, torch_dtype="bfloat16")


def _worker(rank: int, ws: int, root: str, cfg: dict) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{root}/.pg", rank=rank, world_size=ws)
    mesh = init_device_mesh("cpu", (ws,), mesh_dim_names=("fsdp",))
    config = AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "architectures"})
    config.architectures = cfg["architectures"]
    for i, wg in enumerate(GROUPS):
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        model.to_empty(device="cpu")
        g = torch.Generator().manual_seed(1000 * i + rank)
        with torch.no_grad():
            for p in model.parameters():
                p.to_local().copy_(torch.randn(p.to_local().shape, generator=g) * 0.02)
        folder = Path(root) / "global_step_1" / "actor" / wg
        if rank == 0:
            folder.mkdir(parents=True, exist_ok=True)
        dist.barrier()
        torch.save(model.state_dict(), folder / f"model_world_size_{ws}_rank_{rank}.pt")
        if rank == 0:  # as newer verl saves: config in huggingface/, the world size in fsdp_config.json
            config.save_pretrained(folder / "huggingface")
            (folder / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": ws}))
        dist.barrier()
        del model
    if rank == 0:
        (Path(root) / "latest_checkpointed_iteration.txt").write_text("1")
    dist.destroy_process_group()


def build(root: Path, layers: int) -> None:
    import torch.multiprocessing as mp

    cfg = dict(SHAPE, num_hidden_layers=layers)
    root.mkdir(parents=True, exist_ok=True)
    mp.spawn(_worker, args=(2, str(root), cfg), nprocs=2, join=True)
    (root / ".pg").unlink(missing_ok=True)
    from drmas_bench.models import resolve_model

    tiny = Path(resolve_model("tiny-random"))  # a tokenizer, so the merged folders are complete
    for wg in GROUPS:
        for f in tiny.iterdir():
            if f.name.startswith("tokenizer"):
                shutil.copyfile(f, root / "global_step_1" / "actor" / wg / "huggingface" / f.name)


# ------------------------------------------------------------------------------ the mergers (child processes)

_SAMPLER = """
import threading, time
peak = [0]
def _rss_anon():
    for line in open('/proc/self/status'):
        if line.startswith('RssAnon:'):
            return int(line.split()[1]) * 1024
    return 0
def _sample():
    while True:
        peak[0] = max(peak[0], _rss_anon()); time.sleep(0.02)
threading.Thread(target=_sample, daemon=True).start()
def report(t0):
    import json
    hwm = [int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmHWM:')][0]
    peak[0] = max(peak[0], _rss_anon())
    print('BENCH ' + json.dumps({'seconds': time.perf_counter() - t0, 'peak_rss': hwm, 'peak_anon': peak[0]}))
"""

OURS = _SAMPLER + """
import os, sys, time
t0 = time.perf_counter()
from drmas_bench.checkpoints.verl import team_folder
from drmas_bench.needs import reference_roster
folder, _ = team_folder(sys.argv[1], reference_roster(), show_progress=False)
report(t0)
print('FOLDER ' + str(folder))
"""

BASELINE = _SAMPLER + """
import os, sys, time
from pathlib import Path
t0 = time.perf_counter()
import torch
from safetensors.torch import save_file
from drmas_bench.checkpoints.verl_merge import allowed_classes, shard_files
step = Path(sys.argv[1]) / 'global_step_1' / 'actor'
out = Path(sys.argv[2])
for wg in sorted(os.listdir(step)):
    files = shard_files(step / wg)
    with torch.serialization.safe_globals(allowed_classes()):
        shards = [torch.load(f, map_location='cpu', weights_only=True) for f in files]
    full = {}
    for k in list(shards[0]):
        parts = [sd.pop(k) for sd in shards]
        full[k] = torch.cat([p._local_tensor for p in parts], dim=parts[0].placements[0].dim).contiguous()
    del shards
    (out / wg).mkdir(parents=True, exist_ok=True)
    save_file(full, str(out / wg / 'model.safetensors'), metadata={'format': 'pt'})
    del full
report(t0)
"""

VERL = _SAMPLER + """
import os, sys, time
from pathlib import Path
t0 = time.perf_counter()
from verl.model_merger.base_model_merger import ModelMergerConfig
from verl.model_merger.fsdp_model_merger import FSDPModelMerger
step = Path(sys.argv[1]) / 'global_step_1' / 'actor'
for wg in sorted(os.listdir(step)):
    cfg = ModelMergerConfig(operation='merge', backend='fsdp', local_dir=str(step / wg),
                            hf_model_config_path=str(step / wg / 'huggingface'),
                            target_dir=str(Path(sys.argv[2]) / wg))
    FSDPModelMerger(cfg).merge_and_save()
report(t0)
"""


def run(python: str, code: str, *args: str, env: dict) -> tuple[dict, str]:
    p = subprocess.run([python, "-c", code, *args], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise SystemExit(f"merger failed:\n{p.stderr[-2000:]}")
    line = next(l for l in p.stdout.splitlines() if l.startswith("BENCH "))
    folder = next((l[7:] for l in p.stdout.splitlines() if l.startswith("FOLDER ")), "")
    return json.loads(line[6:]), folder


def equal_weights(a: Path, b: Path) -> bool:
    from safetensors import safe_open

    with safe_open(str(a), "pt") as fa, safe_open(str(b), "pt") as fb:
        ka, kb = set(fa.keys()), set(fb.keys())
        shared = ka & kb
        if ka - kb - {"lm_head.weight"} or kb - ka - {"lm_head.weight"}:
            return False
        import torch

        return all(torch.equal(fa.get_tensor(k), fb.get_tensor(k)) for k in shared)


def _verl_weights(folder: Path) -> Path:
    files = sorted(folder.glob("*.safetensors"))
    if len(files) != 1:  # a sharded save: join it (tests only the equality)
        from safetensors.torch import load_file, save_file

        merged = {}
        for f in files:
            merged.update(load_file(str(f)))
        save_file(merged, str(folder / "joined.st"))
        return folder / "joined.st"
    return files[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="scratch folder (checkpoint, merged folders, cache)")
    ap.add_argument("--layers", type=int, default=24, help="decoder layers (24: the 0.5B shape)")
    ap.add_argument("--verl-python", default=None, help="an interpreter that imports the PyPI verl package")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = ap.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    build(out / "ckpt", args.layers)
    size = sum(f.stat().st_size for f in (out / "ckpt").rglob("model_world_size_*.pt"))
    print(f"built 3 x {args.layers}-layer random checkpoint ({size / 1e9:.2f} GB of model shards) "
          f"in {time.perf_counter() - t0:.0f}s")
    env = dict(os.environ, DRMAS_CACHE_DIR=str(out / "cache"), OMP_NUM_THREADS="1")
    results = {}
    results["ours"], folder = run(sys.executable, OURS, str(out / "ckpt"), env=env)
    results["baseline"], _ = run(sys.executable, BASELINE, str(out / "ckpt"), str(out / "baseline"), env=env)
    src = json.loads((Path(folder) / "source.json").read_text())["groups"]
    same = all(equal_weights(Path(folder) / "models" / name / "model.safetensors",
                             out / "baseline" / wg / "model.safetensors") for name, wg in src.items())
    results["baseline"]["equal_to_ours"] = same
    if args.verl_python:
        results["verl"], _ = run(args.verl_python, VERL, str(out / "ckpt"), str(out / "verl"), env=env)
        results["verl"]["equal_to_ours"] = all(
            equal_weights(Path(folder) / "models" / name / "model.safetensors", _verl_weights(out / "verl" / wg))
            for name, wg in src.items())
    print(f"{'merger':10} {'seconds':>8} {'peak RSS':>10} {'peak anon':>10}  equal")
    for name, r in results.items():
        print(f"{name:10} {r['seconds']:8.1f} {r['peak_rss'] / 1e9:9.2f}G {r['peak_anon'] / 1e9:9.2f}G  "
              f"{r.get('equal_to_ours', '-')}")
    b, o = results["baseline"], results["ours"]
    print(f"ours / baseline: time x{o['seconds'] / b['seconds']:.2f}, peak RSS x{o['peak_rss'] / b['peak_rss']:.2f}, "
          f"peak anonymous x{o['peak_anon'] / b['peak_anon']:.2f}")
    if not args.keep:
        shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
