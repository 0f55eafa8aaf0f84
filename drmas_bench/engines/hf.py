"""``hf``: a transformers model in this process (CPU or CUDA), the embedded default engine.

    engine = make_engine("hf", "tiny-random", max_batch=16)
    [c] = await engine.generate([Request("solver", [{"role": "user", "content": "2+2?"}])])

Options (``HFOptions``):

- ``device``: ``"auto"`` (CUDA when available, else CPU) | ``"cpu"`` | ``"cuda"`` | ``"cuda:N"``.
- ``dtype``: ``"auto"`` (bfloat16 on CUDA, float32 on CPU) | ``"float32"`` | ``"bfloat16"`` |
  ``"float16"``.
- ``max_batch``: most requests decoded together in one batch (micro-batcher, ``batcher.py``).
- ``max_wait_ms``: how long a request may wait for others to join its batch.
- ``attn_implementation``: passed to ``from_pretrained`` (``None`` = transformers' default, sdpa).
- ``chat_template_kwargs``: extra variables for the chat template (``enable_thinking`` is not one:
  it comes from each request's ``Sampling.enable_thinking``, off by default).
- ``eos_token_ids``: token ids that end a response; default: every eos id of the model's
  ``generation_config`` (plus the tokenizer's eos).
- ``sleep_mode``: ``"auto"`` (CPU: ``"drop"``, CUDA: ``"offload"``) | ``"drop"`` (free the weights;
  ``wake`` reloads them from safetensors - weights changed by ``update_weights`` are saved to a
  private temporary folder first) | ``"offload"`` (move weights to pinned host memory; ``wake``
  moves them back).
- ``auto_wake``: ``generate`` on a sleeping engine wakes it first (True) or raises (False).
- ``trust_remote_code``: passed to ``from_pretrained``.
- ``batch_invariant``: True (default) = batch-invariant decoding (below); False = the padded batch.

**LoRA adapters** (trait ``serves_adapters``): ``model`` may be an adapter folder
(``drmas_bench.models.adapters``: one peft adapter, or a trainer checkpoint's ``models/<wg>/`` with
one adapter per agent). The base is loaded once and the adapters attached with peft; a request is
served with the adapter of its ``agent`` (the only adapter when there is one; the bare base when
the agent has none). A batch holding requests of several adapters is decoded one adapter at a time
(peft switches the active adapter per forward), so a forward never mixes adapters.
``update_adapter(name, config, tensors)`` replaces (or adds) one adapter's weights, the trainer's
sync after each update: only adapter tensors travel, the base never changes.

Prompts follow the reference's protocol (REFERENCE.md §2b, ``prompt.encode_request``): the chat
template with the generation prompt and ``enable_thinking=Sampling.enable_thinking`` (templates
that do not use the variable ignore it), tokenized, then cut to ``Request.max_prompt_tokens`` on
``Request.truncate``'s side (``Completion.prompt_truncated`` says so). Sampling honours
``temperature``, ``top_p`` and ``top_k`` (-1 = none; with both, a token must be in the top k AND in
the top-p nucleus of the untruncated distribution, as SGLang does).

Decoding is our own loop (not ``model.generate``), and by default **a request's tokens and
log-probs do not depend on the other requests in its batch** (``batch_invariant=true``,
``invariant.py``): each prompt is prefilled alone at its own shape, attention runs per request over
its own keys, and the decode steps' linear layers run on fixed 8-row blocks, so every reduction
keeps one order per row whatever ``max_batch``, the concurrency or the timing put beside it. Each
request draws its randomness from its own ``torch.Generator`` seeded with ``Sampling.seed`` (one
uniform number per token, inverse-CDF sampling in vocabulary order); rows finish independently and
leave the batch. Temperature 0 is greedy. ``batch_invariant=false`` keeps the padded-batch decode
(``decoding.padded_decode``: left padding, one KV cache for the batch), faster but equal to the
request alone only in practice in fp32 (logits differ in the last bits, up to 4e-5 on smollm2-135m)
and often not in bf16. ``determinism()`` says which one runs.

``Completion.logprobs`` (when ``Request.want_logprobs``) are ``log_softmax(raw logits)`` of the
sampled token: the policy's log-probability at temperature 1, whatever the sampling temperature or
top-p (what the trainer needs as old log-probs). ``token_ids`` include the final EOS token when the
response stopped on one; ``text`` has special tokens stripped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import inspect
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from transformers import AutoTokenizer

from drmas_bench.engines.base import (
    EngineBase,
    EngineError,
    parse_options,
    resolve_model_path,
)
from drmas_bench.engines.batcher import MicroBatcher
from drmas_bench.engines.decoding import Rows, padded_decode
from drmas_bench.engines.invariant import check_model, install, invariant_decode
from drmas_bench.engines.prompt import encode_chat, encode_request, extra_template_kwargs
from drmas_bench.files import safe_name
from drmas_bench.log import squeeze
from drmas_bench.models.adapters import (
    BASE_FILE,
    is_adapter_folder,
    load_adapted_lm,
    resolve_base,
    save_adapter,
    tokenizer_source,
)
from drmas_bench.models.loading import load_causal_lm
from drmas_bench.types import Completion, Request

_DTYPES = ("auto", "float32", "bfloat16", "float16")
_SLEEP_MODES = ("auto", "drop", "offload")


@dataclass
class HFOptions:
    """Options of the ``hf`` engine (see the module docstring for each one)."""

    device: str = "auto"
    dtype: str = "auto"
    max_batch: int = 32
    max_wait_ms: float = 5.0
    attn_implementation: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    eos_token_ids: list[int] | None = None
    sleep_mode: str = "auto"
    auto_wake: bool = True
    trust_remote_code: bool = False
    # True (default): a request's tokens and log-probs do not depend on its batch (invariant.py).
    # False keeps the padded-batch decode (decoding.padded_decode): measurably faster on CPU, but a
    # result then depends on --max-batch, --concurrency, --workers and timing (bf16: most episodes).
    batch_invariant: bool = True


@dataclass
class _Item:
    """One request on its way through the batcher."""

    request: Request
    prompt_ids: list[int]
    truncated: bool = False  # the prompt was cut to request.max_prompt_tokens


class HFEngine(EngineBase):
    """A transformers causal LM behind the engine protocol (see module docstring)."""

    name: ClassVar[str] = "hf"
    Options: ClassVar[type] = HFOptions
    output_neutral_options: ClassVar[tuple[str, ...]] = ("max_batch", "max_wait_ms", "sleep_mode", "auto_wake")

    @classmethod
    def resolved_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        """``device`` as its kind (``cuda:1`` computes what ``cuda`` does) and ``"auto"`` device / dtype
        as they resolve in this process (CUDA: bfloat16, CPU: float32), as ``__init__`` resolves them:
        a CPU float32 completion and a GPU bfloat16 one are not the same call."""
        out = dict(options)
        device = str(out.get("device", "auto"))
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        out["device"] = device.split(":", 1)[0]
        if out.get("dtype", "auto") == "auto":
            out["dtype"] = "bfloat16" if out["device"] == "cuda" else "float32"
        return out

    @classmethod
    def neutral_options(cls, options: dict[str, Any]) -> tuple[str, ...]:
        """Batching is neutral only where decoding is batch-invariant: the padded batch's completions
        depend on the batch a request lands in, so there ``max_batch`` / ``max_wait_ms`` are part of
        the call (a cached max-batch-32 reply is not a max-batch-1 one)."""
        if options.get("batch_invariant", True):
            return cls.output_neutral_options
        return tuple(o for o in cls.output_neutral_options if o not in ("max_batch", "max_wait_ms"))

    serves_adapters: ClassVar[bool] = True

    def __init__(self, model: str, **options: Any) -> None:
        self.model = model
        self.options: HFOptions = parse_options(HFOptions, options, kind=self.name)
        o = self.options
        if o.dtype not in _DTYPES:
            raise EngineError(f"hf engine: dtype must be one of {', '.join(_DTYPES)}, got {o.dtype!r}")
        if o.sleep_mode not in _SLEEP_MODES:
            raise EngineError(f"hf engine: sleep_mode must be one of {', '.join(_SLEEP_MODES)}, got {o.sleep_mode!r}")
        if not isinstance(o.batch_invariant, bool):
            raise EngineError(f"hf engine: batch_invariant must be true or false, got {o.batch_invariant!r}")
        self.path = resolve_model_path(model)
        self.device = torch.device(
            ("cuda" if torch.cuda.is_available() else "cpu") if o.device == "auto" else o.device
        )
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise EngineError(f"hf engine: device {o.device!r} asked for, but CUDA is not available")
        if o.dtype == "auto":
            self.dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        else:
            self.dtype = getattr(torch, o.dtype)
        self.sleep_mode = o.sleep_mode
        if self.sleep_mode == "auto":
            self.sleep_mode = "offload" if self.device.type == "cuda" else "drop"

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_source(self.path), trust_remote_code=o.trust_remote_code)
        except (OSError, ValueError) as exc:
            raise EngineError(f"hf engine: cannot load the tokenizer of {model!r} ({self.path}): {squeeze(exc)}") from exc
        if not getattr(self.tokenizer, "chat_template", None):
            raise EngineError(f"hf engine: the tokenizer of {model!r} has no chat template")
        self.chat_template_kwargs = extra_template_kwargs(o.chat_template_kwargs, kind=self.name)
        self._lock = threading.RLock()  # one user of the weights at a time (batch, sleep, wake, update)
        self._load_path = self.path  # where wake() reloads from in "drop" mode
        self._tmpdir: str | None = None  # private copy of updated weights
        self._dirty = False  # weights changed since they were last loaded from _load_path
        self._awake = False
        self._hf_model: Any = None
        self._footprint = 0
        self._layout: Any = None  # an adapter folder's layout (models.adapters), when serving adapters
        self._load()
        self.eos_ids = self._eos_ids()
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad) if pad is not None else min(self.eos_ids)
        self.batcher: MicroBatcher[_Item, Completion] = MicroBatcher(
            self._run_batch, max_batch=o.max_batch, max_wait_ms=o.max_wait_ms, key=lambda it: len(it.prompt_ids)
        )
        self.forward_calls = 0  # model forward passes (for tests and benchmarks)

    # ------------------------------------------------------------------ loading

    def _load(self) -> None:
        kwargs: dict[str, Any] = {"dtype": self.dtype, "trust_remote_code": self.options.trust_remote_code}
        if self.options.attn_implementation:
            kwargs["attn_implementation"] = self.options.attn_implementation

        try:
            if is_adapter_folder(self._load_path):
                m, self._layout = load_adapted_lm(self._load_path, **kwargs)
            else:
                m = load_causal_lm(self._load_path, **kwargs)
        except (OSError, ValueError) as exc:
            raise EngineError(f"hf engine: cannot load model {self.model!r} ({self._load_path}): {squeeze(exc)}") from exc
        if self.options.batch_invariant:
            check_model(m, self.options.attn_implementation, self.model)
            install(m)
        m.to(self.device)
        m.eval()
        m.requires_grad_(False)
        self._hf_model = m
        self._awake = True
        inner = m.get_base_model() if self._layout is not None else m  # peft's forward takes **kwargs
        sig = inspect.signature(inner.forward).parameters
        # transformers 5.x renamed past_key_values -> cache and num_logits_to_keep -> logits_to_keep
        self._cache_kw = "cache" if "cache" in sig else "past_key_values"
        self._logits_kw = next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in sig), None)
        self._footprint = sum(t.numel() * t.element_size() for t in m.parameters()) + sum(
            t.numel() * t.element_size() for t in m.buffers()
        )

    def _eos_ids(self) -> set[int]:
        if self.options.eos_token_ids is not None:
            return {int(i) for i in self.options.eos_token_ids}
        ids: set[int] = set()
        gc_eos = getattr(getattr(self._hf_model, "generation_config", None), "eos_token_id", None)
        for src in (gc_eos, self.tokenizer.eos_token_id):
            if src is None:
                continue
            ids.update(int(i) for i in (src if isinstance(src, (list, tuple)) else [src]))
        if not ids:
            raise EngineError(f"hf engine: model {self.model!r} defines no eos token; pass eos_token_ids")
        return ids

    # ------------------------------------------------------------------ protocol

    @property
    def is_awake(self) -> bool:
        return self._awake

    def footprint_bytes(self) -> int:
        """Parameter + buffer bytes of the loaded model (also while asleep)."""
        return self._footprint

    @property
    def stats(self):  # noqa: ANN201 - BatcherStats
        """Batches run so far (``batches``, ``items``, ``largest``, ``sizes``)."""
        return self.batcher.stats

    def encode_prompt(self, messages: list[dict[str, str]], *, enable_thinking: bool = False) -> list[int]:
        """Chat messages -> prompt token ids (chat template + generation prompt), uncut."""
        return encode_chat(self.tokenizer, messages, {**self.chat_template_kwargs, "enable_thinking": enable_thinking}, model=self.model)

    def encode_request(self, request: Request) -> tuple[list[int], bool]:
        """The prompt ids this engine runs for ``request`` and whether they were cut
        (``prompt.encode_request``: template, enable_thinking, prompt limit)."""
        return encode_request(self.tokenizer, request, self.chat_template_kwargs, model=self.model, kind=self.name)

    async def generate(self, requests: list[Request]) -> list[Completion]:
        """One Completion per Request, in order; concurrent calls are batched together."""
        t0 = time.perf_counter()
        items = [_Item(r, *self.encode_request(r)) for r in requests]
        out = await self.batcher.submit(items)
        dt = time.perf_counter() - t0
        for c in out:
            c.latency_s = dt
        return out

    async def sleep(self) -> None:
        await asyncio.to_thread(self._sleep_sync)

    async def wake(self) -> None:
        await asyncio.to_thread(self._wake_sync)

    async def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Copy new values into the model's weights (names as in ``model.state_dict()``), e.g. after
        a training step. Shapes must match; an unknown name is an error."""
        await asyncio.to_thread(self._update_sync, list(named_tensors))

    async def update_adapter(self, name: str, config: dict[str, Any], tensors: dict[str, Any]) -> None:
        """Replace adapter ``name``'s weights with ``tensors`` (names as peft saves them), adding the
        adapter from its peft ``config`` when this engine does not serve it yet."""
        await asyncio.to_thread(self._update_adapter_sync, name, dict(config), dict(tensors))

    async def close(self) -> None:
        await self.batcher.close()
        with self._lock:
            self._hf_model = None
            self._awake = False
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None
        gc.collect()

    # ------------------------------------------------------------------ lifecycle (worker thread)

    def _sleep_sync(self) -> None:
        with self._lock:
            if not self._awake:
                return
            m = self._hf_model
            if self.sleep_mode == "offload":
                for t in list(m.parameters()) + list(m.buffers()):
                    host = t.data.to("cpu")
                    t.data = host.pin_memory() if torch.cuda.is_available() else host
            else:
                if self._dirty:
                    if self._tmpdir is None:
                        self._tmpdir = tempfile.mkdtemp(prefix="drmas-hf-weights-")
                    if self._layout is not None:
                        self._save_adapters(self._tmpdir)
                    else:
                        m.save_pretrained(self._tmpdir)
                    self._load_path = self._tmpdir
                    self._dirty = False
                self._hf_model = None
                del m
                gc.collect()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            self._awake = False

    def _wake_sync(self) -> None:
        with self._lock:
            if self._awake:
                return
            if self._hf_model is None:
                self._load()
            else:
                self._hf_model.to(self.device)
                self._awake = True

    def _update_sync(self, named: list[tuple[str, Any]]) -> None:
        with self._lock:
            if self._hf_model is None:
                self._wake_sync()
            sd = self._hf_model.state_dict()
            with torch.no_grad():
                for name, value in named:
                    if name not in sd:
                        raise EngineError(f"hf engine: update_weights got unknown weight {name!r}")
                    if tuple(sd[name].shape) != tuple(value.shape):
                        raise EngineError(
                            f"hf engine: update_weights {name!r} has shape {tuple(value.shape)}, "
                            f"expected {tuple(sd[name].shape)}"
                        )
                    sd[name].copy_(value)  # converts device and dtype in the one pass, no fresh tensor
            self._dirty = True

    def _update_adapter_sync(self, name: str, config: dict[str, Any], tensors: dict[str, Any]) -> None:
        from peft import LoraConfig, set_peft_model_state_dict  # deferred: only an adapter update needs peft

        safe_name(name, "hf engine: adapter")
        with self._lock:
            if self._hf_model is None:
                self._wake_sync()
            m = self._hf_model
            if self._layout is None:
                raise EngineError(f"hf engine: {self.model!r} was started without adapters; start it from an "
                                  f"adapter folder to serve and update LoRA adapters")
            if name not in m.peft_config:
                known = {k for k in LoraConfig.__dataclass_fields__}
                m.add_adapter(name, LoraConfig(**{k: v for k, v in config.items() if k in known}))
                m.to(self.device)
                m.requires_grad_(False)
                self._layout.adapters[name] = None
            out = set_peft_model_state_dict(m, {k: v.to(self.device) for k, v in tensors.items()}, adapter_name=name)
            unexpected = list(getattr(out, "unexpected_keys", []) or [])
            if unexpected:
                raise EngineError(f"hf engine: update_adapter {name!r} got unknown tensor(s) {', '.join(unexpected[:3])}")
            self._dirty = True

    def _save_adapters(self, folder: str) -> None:
        """The served adapters, as they are now, as an adapter folder (drop-mode sleep reloads it)."""

        base = resolve_base(self._layout)
        for n in self._hf_model.peft_config:
            save_adapter(self._hf_model, n, os.path.join(folder, n), base)
        with open(os.path.join(folder, BASE_FILE), "w", encoding="utf-8") as f:
            json.dump({"name": base, "identity": self._layout.identity}, f)

    # ------------------------------------------------------------------ decoding (worker thread)

    def _run_batch(self, items: list[_Item]) -> list[Completion]:
        with self._lock:
            if not self._awake:
                if not self.options.auto_wake:
                    raise EngineError(f"hf engine {self.model!r} is asleep; call wake() first")
                self._wake_sync()
            with torch.inference_mode():
                if self._layout is None:
                    return self._decode(items)
                return self._decode_per_adapter(items)

    def _decode_per_adapter(self, items: list[_Item]) -> list[Completion]:
        """Decode ``items`` one adapter at a time (module docstring), results in the given order."""
        groups: dict[str | None, list[int]] = {}
        for i, it in enumerate(items):
            groups.setdefault(self._layout.adapter_for(it.request.agent), []).append(i)
        m = self._hf_model
        results: list[Any] = [None] * len(items)
        for adapter, idx in groups.items():
            if adapter is None:
                with m.disable_adapter():
                    outs = self._decode([items[i] for i in idx])
            else:
                if m.active_adapter != adapter:
                    m.set_adapter(adapter)
                    m.requires_grad_(False)
                outs = self._decode([items[i] for i in idx])
            for i, c in zip(idx, outs):
                results[i] = c
        return results

    def _decode(self, items: list[_Item]) -> list[Completion]:
        rows = Rows(items, self.device, self.eos_ids)
        if rows.rows:
            (invariant_decode if self.options.batch_invariant else padded_decode)(self, rows)
        return rows.completions(self.tokenizer)

    @classmethod
    def declared_determinism(cls, options: dict[str, Any]) -> dict[str, Any]:
        """How reproducible an engine started with ``options`` is, known before it starts (a resume, a
        split over workers or Ray actors and the run's reproducibility block ask this)."""
        if options.get("batch_invariant", True):
            why = ("each request is prefilled alone and decoded with per-request attention and fixed-row "
                   "linear blocks: its tokens and log-probs do not depend on the other requests in its batch")
        else:
            why = ("batch_invariant=false: prompts are left-padded and decoded together, so a request's "
                   "logits depend on its batch in the last bits (fp32) or more (bf16)")
        return {"batch_invariant": bool(options.get("batch_invariant", True)), "why": why,
                "dtype": str(options.get("dtype") or "auto")}

    def determinism(self) -> dict[str, Any]:
        """``declared_determinism`` of this engine's options, with the dtype it runs in."""
        return {**self.declared_determinism(dataclasses.asdict(self.options)),
                "dtype": str(self.dtype).removeprefix("torch.")}
