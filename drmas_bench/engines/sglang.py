"""``sglang``: the in-process ``sglang.Engine`` (GPU) behind the engine protocol.

    engine = make_engine("sglang", "Qwen/Qwen3-4B", mem_fraction_static=0.5)
    completions = await engine.generate(requests)
    await engine.sleep(); await engine.wake()            # release / resume GPU memory
    await engine.update_weights(model.named_parameters())  # after a training step

Needs ``pip install drmas-bench[sglang]`` (imported only when an engine is started). Prompts are
rendered with the model's chat template here (``enable_thinking`` from the sampling), cut to
``Request.max_prompt_tokens`` on ``Request.truncate``'s side (same ids as the ``hf`` engine,
``prompt.encode_request``) and sent as ``input_ids``; the sampling params carry ``top_k`` explicitly
(-1 = whole vocabulary), so no server-side default (``preferred_sampling_params``) applies.
SGLang's scheduler batches concurrent calls itself (continuous batching), so no micro-batcher
sits in front of it. The SGLang engine is started lazily, inside the event loop of
the first ``generate`` / ``wake`` / ``start`` call, and must be used from that loop only (its
tokenizer manager is bound to it). Starting blocks that loop for the start-up time.

Options (``SGLangOptions``):

- ``mem_fraction_static``: share of GPU memory for weights + KV cache (``None``: SGLang decides;
  the footprint estimate then assumes ``DEFAULT_MEM_FRACTION``).
- ``tp_size``: tensor-parallel GPUs.
- ``dtype``: ``"auto"`` (SGLang's rule: the checkpoint's dtype, float16 for float32 checkpoints) |
  ``"bfloat16"`` | ``"float16"`` | ``"float32"``. The trainer passes its compute dtype, so the
  rollout engine and the policy compute in the same precision (first PPO ratio 1).
- ``enable_memory_saver``: needed for ``sleep``/``wake`` (release/resume memory occupation).
- ``release_tags``: which memory ``sleep`` releases (``None``: all, i.e. weights and KV cache).
- ``original_logprobs``: return ``log_softmax`` of the raw logits (temperature 1), like the
  ``hf`` engine, by setting ``SGLANG_RETURN_ORIGINAL_LOGPROB=1`` before SGLang starts; False keeps
  SGLang's default (log-probs after temperature).
- ``chat_template_kwargs``: extra chat-template variables (``enable_thinking`` comes from
  ``Sampling.enable_thinking``, off by default).
- ``auto_wake``: ``generate`` on a sleeping engine wakes it first (True) or raises (False).
- ``trust_remote_code``: for the tokenizer and the model.
- ``deterministic``: start SGLang with its deterministic inference (``enable_deterministic_inference``,
  batch-invariant kernels: a request's tokens do not depend on what shares its batch) and an
  attention backend SGLang supports in that mode (``DETERMINISTIC_BACKENDS``; ``triton`` unless
  ``engine_args`` names another). A combination SGLang would refuse or silently change is refused here
  (``deterministic_args``); docs/engines.md cites the sglang source.
- ``engine_args``: any other ``sglang.Engine`` / ``ServerArgs`` keyword (e.g.
  ``{"attention_backend": "triton", "random_seed": 0}``).

**One engine per process.** SGLang 0.5.x keeps its configuration in process-wide state (the last
``sglang.Engine`` created wins) and ``Engine.shutdown()`` kills every child process of the
process. The class therefore declares ``process_wide = True``, and ``drmas_bench.engines.hosting``
runs each one in its own child process (the pool and the trainer create engines through it).

**Weight updates** (SGLang >= 0.5.17): ``update_weights(named_tensors, bucket_bytes=..., flush_cache=...)``
consumes the pairs lazily in buckets of about ``bucket_bytes`` and sends each bucket with
``update_weights_from_tensor``, all inside ONE ``begin_weight_update`` / ``end_weight_update``
session (required since 0.5.21; skipped on older releases, which lack it). A ``(False, message)``
answer is an ``EngineError`` with SGLang's message; the session is ended in every case.
Tensors are serialised with ``Engine._serialize_tensors_per_rank`` (private, 0.5.17+), falling
back to ``MultiprocessingSerializer`` once per tensor-parallel rank when it is missing.

**LoRA adapters** (trait ``serves_adapters``; SGLang 0.5.23's multi-LoRA serving): ``model`` may be an
adapter folder (``drmas_bench.models.adapters``). SGLang then starts on the base with
``enable_lora=True``, ``lora_paths={name: folder}``, ``max_lora_rank`` and ``lora_target_modules`` from
the adapters' configs (so adapters of that shape can be loaded later) and ``max_loras_per_batch`` of at
least adapters + 1 (the base); each request is sent with ``lora_path`` = its agent's adapter name
(``None``: the base). ``update_adapter(name, config, tensors)`` replaces an adapter as 0.5.23 offers it:
``unload_lora_adapter`` (when loaded) then ``load_lora_adapter_from_tensors`` (the peft config as
``config_dict``, the tensors serialised per tensor-parallel rank), both through the tokenizer manager
under the same lock as weight updates, so no request runs while an adapter is missing. Not run on a
GPU here (the API double in tests/fake_sglang follows the 0.5.23 source).

**Footprint**: ``footprint_bytes()`` is known before SGLang starts: the larger of the weights
(parameter count from the folder's safetensors headers or config.json, times the bytes of
``dtype``) and the static pool SGLang reserves (``mem_fraction_static`` x GPU memory x
``tp_size``); after start, the GPU memory SGLang actually took.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, ClassVar

from drmas_bench.checkpoints.adapter_names import is_adapter_folder
from drmas_bench.engines.base import (
    EngineBase,
    EngineError,
    parse_options,
    resolve_model_path,
)
from drmas_bench.engines.footprint import weight_bytes
from drmas_bench.engines.prompt import encode_request, extra_template_kwargs
from drmas_bench.engines.sglang_args import (  # noqa: F401 - re-exported: the engine's public translations
    DEFAULT_MEM_FRACTION,
    DETERMINISTIC_BACKENDS,
    DTYPES,
    INSTALL_HINT,
    SGLangOptions,
    completion_from_output,
    deterministic_args,
    generate_kwargs,
    is_deterministic,
    lora_server_args,
    sampling_params,
)
from drmas_bench.engines.weights import DEFAULT_BUCKET_BYTES, buckets
from drmas_bench.log import squeeze
from drmas_bench.models.adapter_layout import adapter_layout, resolve_base, tokenizer_source
from drmas_bench.types import Completion, Request

# ---------------------------------------------------------------------- engine


class SGLangEngine(EngineBase):
    """``sglang.Engine`` in this process (see module docstring)."""

    name: ClassVar[str] = "sglang"
    Options: ClassVar[type] = SGLangOptions
    process_wide: ClassVar[bool] = True  # one per process: drmas_bench.engines.hosting gives it a child
    gpu_memory_fraction: ClassVar[tuple[str, float] | None] = ("mem_fraction_static", DEFAULT_MEM_FRACTION)
    output_neutral_options: ClassVar[tuple[str, ...]] = ("mem_fraction_static", "enable_memory_saver", "release_tags",
                                                         "auto_wake")
    serves_adapters: ClassVar[bool] = True

    def __init__(self, model: str, **options: Any) -> None:
        from transformers import AutoTokenizer

        self.model = model
        self.options: SGLangOptions = parse_options(SGLangOptions, options, kind=self.name)
        if self.options.dtype not in DTYPES:
            raise EngineError(f"sglang engine: unknown dtype {self.options.dtype!r}; choose one of: {', '.join(DTYPES)}")
        self._deterministic_args = deterministic_args(self.options.deterministic, self.options.engine_args)

        self.path = resolve_model_path(model)
        self._layout = adapter_layout(self.path) if is_adapter_folder(self.path) else None
        self._loaded_adapters: set[str] = set(self._layout.adapters) if self._layout is not None else set()
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_source(self.path),
                                                           trust_remote_code=self.options.trust_remote_code)
        except (OSError, ValueError) as exc:
            raise EngineError(f"sglang engine: cannot load the tokenizer of {model!r} ({self.path}): {squeeze(exc)}") from exc
        self.chat_template_kwargs = extra_template_kwargs(self.options.chat_template_kwargs, kind=self.name)
        self._engine: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._awake = False
        self._footprint = 0  # measured at start; before that, estimated_footprint()
        self._estimate: int | None = None
        self._inflight = 0
        self._idle: asyncio.Event | None = None
        self._state_lock: asyncio.Lock | None = None

    def server_args(self) -> dict[str, Any]:
        """Keyword arguments for ``sglang.Engine`` (pure; tested directly)."""
        o = self.options
        args: dict[str, Any] = {
            "model_path": self.path,
            "tp_size": o.tp_size,
            "dtype": o.dtype,
            "enable_memory_saver": o.enable_memory_saver,
            "trust_remote_code": o.trust_remote_code,
        }
        if o.mem_fraction_static is not None:
            args["mem_fraction_static"] = o.mem_fraction_static
        if self._layout is not None:
            args.update(lora_server_args(self._layout))
        args.update(o.engine_args or {})
        args.update(self._deterministic_args)
        return args

    @classmethod
    def declared_determinism(cls, options: dict[str, Any]) -> dict[str, Any]:
        """Batch-invariant only with SGLang's deterministic inference (the ``deterministic`` option)."""
        dtype = str(options.get("dtype") or "auto")
        if is_deterministic(options):
            return {"batch_invariant": True, "dtype": dtype,
                    "why": "SGLang's deterministic inference (batch-invariant kernels) is on"}
        return {"batch_invariant": False, "dtype": dtype,
                "why": "SGLang batches requests continuously and its kernels are not batch-invariant "
                       "(engine option deterministic=true turns its deterministic inference on)"}

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start SGLang in the running event loop (done by the first generate/wake anyway)."""
        loop = asyncio.get_running_loop()
        if self._engine is not None:
            if loop is not self._loop:
                raise EngineError("sglang engine: used from a different event loop than the one it started in")
            return
        if self.options.original_logprobs:
            os.environ.setdefault("SGLANG_RETURN_ORIGINAL_LOGPROB", "1")
        try:
            import sglang
        except ImportError as exc:
            raise EngineError(INSTALL_HINT) from exc
        free_before = _cuda_free_bytes()
        self._engine = sglang.Engine(**self.server_args())
        self._loop = loop
        self._idle = asyncio.Event()
        self._idle.set()
        self._state_lock = asyncio.Lock()
        self._awake = True
        used = free_before - _cuda_free_bytes() if free_before else 0
        self._footprint = used if used > 0 else self.estimated_footprint()

    @property
    def is_awake(self) -> bool:
        return self._awake

    @property
    def keeps_weights_asleep(self) -> bool:
        """False when ``sleep`` releases the weights (``release_tags`` None or naming ``weights``):
        SGLang's memory saver gives the memory back on ``wake`` but not its contents, so the owner
        must load the weights again (the trainer's worker group syncs on that wake)."""
        tags = self.options.release_tags
        return tags is not None and "weights" not in tags

    def footprint_bytes(self) -> int:
        """GPU bytes of weights + KV cache pool: measured once SGLang started, estimated before."""
        if not self._footprint and self._estimate is None:
            self._estimate = self.estimated_footprint()
        return self._footprint or self._estimate or 0

    def estimated_footprint(self, gpu_total_bytes: int | None = None) -> int:
        """The footprint before start (module docstring); ``gpu_total_bytes`` per GPU defaults to
        device 0's memory (0 without CUDA: weights only)."""

        o = self.options
        weights = weight_bytes(self.path if self._layout is None else resolve_base(self._layout), o.dtype)  # LoRA: the base's
        total = _cuda_total_bytes() if gpu_total_bytes is None else gpu_total_bytes
        frac = o.mem_fraction_static if o.mem_fraction_static is not None else DEFAULT_MEM_FRACTION
        return max(weights, int(frac * total * o.tp_size))

    def _tm_and_io(self) -> tuple[Any, Any]:
        from sglang.srt.managers import io_struct

        return self._engine.tokenizer_manager, io_struct

    async def sleep(self) -> None:
        """Release GPU memory (weights and KV cache, or ``release_tags``) after in-flight calls."""
        if self._engine is None or not self._awake:
            return
        if not self.options.enable_memory_saver:
            raise EngineError("sglang engine: sleep() needs enable_memory_saver=True")
        assert self._state_lock is not None and self._idle is not None
        async with self._state_lock:
            await self._idle.wait()
            tm, io = self._tm_and_io()
            await tm.release_memory_occupation(io.ReleaseMemoryOccupationReqInput(tags=self.options.release_tags), None)
            self._awake = False

    async def wake(self) -> None:
        """Resume the memory released by ``sleep`` (starts SGLang if it has not started)."""
        if self._engine is None:
            await self.start()
            return
        if self._awake:
            return
        assert self._state_lock is not None
        async with self._state_lock:
            if self._awake:
                return
            tm, io = self._tm_and_io()
            await tm.resume_memory_occupation(io.ResumeMemoryOccupationReqInput(tags=self.options.release_tags), None)
            self._awake = True

    async def update_weights(self, named_tensors: Any, *, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                             flush_cache: bool = True) -> None:
        """Load new weights from ``(name, tensor)`` pairs (a list, a generator or an async iterable,
        consumed lazily in ~``bucket_bytes`` buckets) inside one weight-update session; the KV cache
        is flushed after the last bucket when ``flush_cache``. A refused update is an ``EngineError``."""
        await self.start()
        if not self._awake:
            await self.wake()
        assert self._state_lock is not None and self._idle is not None
        tm, io = self._tm_and_io()
        session = hasattr(tm, "begin_weight_update")  # 0.5.21+: updates only inside a session
        async with self._state_lock:  # no generate / sleep / wake while weights change
            await self._idle.wait()
            if session:
                _check(await tm.begin_weight_update(io.BeginWeightUpdateReqInput(), None), "begin_weight_update")
            failed = True
            try:
                pending: list[tuple[str, Any]] | None = None
                async for bucket in buckets(named_tensors, bucket_bytes):
                    if pending is not None:
                        await self._send_bucket(tm, io, pending, flush_cache=False)
                    pending = bucket
                if pending is not None:
                    await self._send_bucket(tm, io, pending, flush_cache=flush_cache)
                failed = False
            finally:
                if session:
                    await self._end_session(tm, io, quiet=failed)

    async def update_adapter(self, name: str, config: dict[str, Any], tensors: dict[str, Any]) -> None:
        """Replace (or add) LoRA adapter ``name`` from ``tensors`` (names as peft saves them) and its
        peft ``config``: unload, then load from tensors (module docstring). Refused: EngineError."""
        if self._layout is None:
            raise EngineError(f"sglang engine: {self.model!r} was started without adapters; start it from an "
                              f"adapter folder to serve and update LoRA adapters")
        await self.start()
        if not self._awake:
            await self.wake()
        assert self._state_lock is not None and self._idle is not None
        tm, io = self._tm_and_io()
        async with self._state_lock:
            await self._idle.wait()
            if name in self._loaded_adapters:
                _check(await tm.unload_lora_adapter(io.UnloadLoRAAdapterReqInput(lora_name=name), None),
                       f"unload_lora_adapter {name}")
                self._loaded_adapters.discard(name)
            req = io.LoadLoRAAdapterFromTensorsReqInput(lora_name=name, config_dict=dict(config),
                                                         serialized_named_tensors=self._serialize(dict(tensors)))
            _check(await tm.load_lora_adapter_from_tensors(req, None), f"load_lora_adapter_from_tensors {name}")
            self._loaded_adapters.add(name)
            self._layout.adapters.setdefault(name, self._layout.folder / name)

    @staticmethod
    async def _end_session(tm: Any, io: Any, *, quiet: bool) -> None:
        """Close the weight-update session; ``quiet``: an update already failed, so a failure to
        close must not hide its error."""
        try:
            _check(await tm.end_weight_update(io.EndWeightUpdateReqInput(), None), "end_weight_update")
        except Exception:
            if not quiet:
                raise

    async def _send_bucket(self, tm: Any, io: Any, bucket: list[tuple[str, Any]], *, flush_cache: bool) -> None:
        payload = self._serialize(bucket)
        obj = io.UpdateWeightsFromTensorReqInput(serialized_named_tensors=payload, load_format=None, flush_cache=flush_cache)
        _check(await tm.update_weights_from_tensor(obj, None), "update_weights_from_tensor")

    def _serialize(self, bucket: Any) -> list[bytes]:
        """One payload per tensor-parallel rank: SGLang's private ``_serialize_tensors_per_rank``
        (0.5.17+), else ``MultiprocessingSerializer`` per rank (what that method does)."""
        own = getattr(self._engine, "_serialize_tensors_per_rank", None)
        if own is not None:
            return own(bucket, None)
        from sglang.srt.utils import MultiprocessingSerializer

        return [MultiprocessingSerializer.serialize(bucket) for _ in range(self.options.tp_size)]

    async def close(self) -> None:
        engine, self._engine = self._engine, None
        self._awake = False
        if engine is not None:
            engine.shutdown()

    # ------------------------------------------------------------------ generate

    def encode_request(self, request: Request) -> tuple[list[int], bool]:
        """The ``input_ids`` sent for ``request`` and whether they were cut (``prompt.encode_request``)."""
        return encode_request(self.tokenizer, request, self.chat_template_kwargs, model=self.model, kind=self.name)

    async def generate(self, requests: list[Request]) -> list[Completion]:
        """One Completion per Request, in order (SGLang batches concurrent calls)."""
        if not requests:
            return []
        await self.start()
        if not self._awake:
            if not self.options.auto_wake:
                raise EngineError(f"sglang engine {self.model!r} is asleep; call wake() first")
            await self.wake()
        encoded = [self.encode_request(r) for r in requests]
        prompts = [ids for ids, _ in encoded]
        assert self._idle is not None and self._state_lock is not None
        async with self._state_lock:  # not while sleeping/waking
            self._inflight += 1
            self._idle.clear()
        t0 = time.perf_counter()
        try:
            outs = await self._engine.async_generate(**generate_kwargs(prompts, requests, self._layout))
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.set()
        if isinstance(outs, dict):
            outs = [outs]
        dt = time.perf_counter() - t0
        done = []
        for out, (p, cut), r in zip(outs, encoded, requests):
            c = completion_from_output(out, p, r.want_logprobs)
            c.latency_s = dt
            c.prompt_truncated = cut
            done.append(c)
        return done


def _check(result: Any, what: str) -> None:
    """SGLang's ``(success, message)`` answer (or an object with ``success`` / ``message``); a
    failure is an ``EngineError`` carrying the message."""
    if isinstance(result, tuple):
        ok, msg = bool(result[0]), (result[1] if len(result) > 1 else "")
    else:  # RpcReqOutput (message) or LoRAUpdateOutput (error_message)
        ok = bool(getattr(result, "success", True))
        msg = getattr(result, "message", None) or getattr(result, "error_message", None) or ""
    if not ok:
        raise EngineError(f"sglang engine: {what} failed: {squeeze(str(msg))}")


def _cuda_free_bytes() -> int:
    try:
        import torch

        return int(torch.cuda.mem_get_info()[0]) if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - a best-effort figure
        return 0


def _cuda_total_bytes() -> int:
    try:
        import torch

        return int(torch.cuda.get_device_properties(0).total_memory) if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001
        return 0
