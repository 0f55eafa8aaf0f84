"""FAKE ``sglang`` for tests on CPU (NOT SGLang): an API double of the parts of sglang 0.5.23 that
drmas-bench calls, with their real names and signatures, strict about unknown keywords.

Put ``tests/fake_sglang`` first on ``sys.path`` (``monkeypatch.syspath_prepend``): ``import sglang``
then finds this package, in this process and in spawned children (they inherit ``sys.path``).

What it mirrors (from sglang 0.5.23 ``srt/entrypoints/engine.py``, ``srt/managers/*``):

- ``Engine(**kwargs)``: kwargs are ``ServerArgs`` fields; an unknown one is a ``TypeError``
  (here checked against ``SERVER_ARGS_FIELDS``, a subset of the real field names).
- ``await Engine.async_generate(prompt=None, sampling_params=None, input_ids=None, ...,
  return_logprob=False, ...)``: the real parameter list; ``sampling_params`` keys are checked
  against ``SamplingParams``'s fields. Returns one dict per prompt (``text``, ``output_ids``,
  ``meta_info`` with ``prompt_tokens``, ``completion_tokens``, ``finish_reason``,
  ``output_token_logprobs`` as ``(logprob, token_id, None)``), or one dict for one prompt.
- ``Engine.tokenizer_manager``: ``async release_memory_occupation(obj, request=None)``,
  ``resume_memory_occupation``, ``begin_weight_update`` / ``end_weight_update`` /
  ``update_weights_from_tensor`` returning ``(success, message)`` with the real messages (an
  update outside a session is refused, as since 0.5.21), ``flush_cache()``.
- ``Engine._serialize_tensors_per_rank(tensors, load_format)`` (private, 0.5.17+).
- LoRA (``srt/arg_groups/fields/lora.py``, ``srt/managers/tokenizer_control_mixin.py``,
  ``srt/lora/lora_manager.py``): ``enable_lora``, ``lora_paths`` (``{name: path}``), ``max_lora_rank``,
  ``lora_target_modules``, ``max_loras_per_batch``; ``async_generate(lora_path=[name|None, ...])``
  (an adapter never loaded is a ``ValueError``, LoRA not enabled too); the tokenizer manager's
  ``load_lora_adapter_from_tensors`` / ``unload_lora_adapter`` answering ``LoRAUpdateOutput`` (a name
  already loaded is refused with the real message, a rank above ``max_lora_rank`` too). An adapter's
  checksum enters the tokens of the requests that name it.
- Process-wide state: the configuration of the LAST ``Engine`` created in a process is the one in
  force (the fake makes an older engine raise instead of silently misbehaving), and ``shutdown()``
  kills every engine of the process (real: ``kill_process_tree(os.getpid())``).

The "model": the checkpoint's safetensors weights are loaded (float32 on CPU); a generated token is
a deterministic function of the prompt, the sampling seed, the step and a checksum of the current
weights, so a weight update changes the outputs and the same weights give the same outputs.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

__version__ = "0.5.23+fake"

SERVER_ARGS_FIELDS = frozenset({
    "model_path", "tokenizer_path", "tp_size", "dtype", "enable_memory_saver", "trust_remote_code",
    "mem_fraction_static", "log_level", "random_seed", "attention_backend", "skip_tokenizer_init",
    "disable_cuda_graph", "max_running_requests", "context_length", "device", "base_gpu_id",
    "chunked_prefill_size", "max_total_tokens", "max_prefill_tokens", "sampling_backend", "load_format",
    "kv_cache_dtype", "quantization", "disable_radix_cache", "enable_deterministic_inference",
    "enable_lora", "lora_paths", "max_lora_rank", "lora_target_modules", "max_loras_per_batch",
    "max_loaded_loras", "lora_backend", "lora_eviction_policy",
})
SAMPLING_PARAMS_FIELDS = frozenset({
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "beam_width",
    "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
    "spaces_between_special_tokens", "no_stop_trim", "stream_interval", "logit_bias", "sampling_seed",
    "custom_params", "watermark",
})
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
# srt/arg_groups/choices.py (0.5.23)
DETERMINISTIC_ATTENTION_BACKEND_CHOICES = ["ascend", "fa3", "fa4", "flashinfer", "intel_xpu", "triton"]
GPU_MEMORY_ALL_TYPES = ["kv_cache", "weights", "cuda_graph"]

# process-wide, like sglang's runtime context (get_parallel() / get_model() ...)
_PROCESS: dict[str, Any] = {"current": None, "engines": []}
CALLS: list[tuple[str, Any]] = []  # (method, detail) in call order, for assertions in this process


class TokenizerManager:
    """The async control methods of sglang's ``TokenizerManager`` (its control mixin)."""

    def __init__(self, engine: "Engine") -> None:
        self._engine = engine
        self.session_open = False
        self.released: set[str] = set()

    async def release_memory_occupation(self, obj: Any, request: Optional[Any] = None) -> None:
        from sglang.srt.managers.io_struct import ReleaseMemoryOccupationReqInput

        assert isinstance(obj, ReleaseMemoryOccupationReqInput), type(obj)
        self._engine._alive()
        if not self._engine.server_args["enable_memory_saver"]:
            raise RuntimeError("FAKE sglang: release_memory_occupation needs enable_memory_saver=True")
        assert self._engine.running == 0, "release_memory_occupation should be called only when server is idle."
        self.released |= set(obj.tags or GPU_MEMORY_ALL_TYPES)
        CALLS.append(("release_memory_occupation", obj.tags))

    async def resume_memory_occupation(self, obj: Any, request: Optional[Any] = None) -> None:
        from sglang.srt.managers.io_struct import ResumeMemoryOccupationReqInput

        assert isinstance(obj, ResumeMemoryOccupationReqInput), type(obj)
        self._engine._alive()
        for tag in obj.tags or GPU_MEMORY_ALL_TYPES:
            self.released.remove(tag)  # KeyError like the real set.remove when not released
        CALLS.append(("resume_memory_occupation", obj.tags))

    async def begin_weight_update(self, obj: Any, request: Optional[Any] = None) -> tuple[bool, str]:
        from sglang.srt.managers.io_struct import BeginWeightUpdateReqInput

        assert isinstance(obj, BeginWeightUpdateReqInput), type(obj)
        self._engine._alive()
        CALLS.append(("begin_weight_update", obj.selector))
        if self.session_open:
            return False, "a weight-update session is already open; call end_weight_update() first"
        self.session_open = True
        return True, "Success"

    async def end_weight_update(self, obj: Any, request: Optional[Any] = None) -> tuple[bool, str]:
        from sglang.srt.managers.io_struct import EndWeightUpdateReqInput

        assert isinstance(obj, EndWeightUpdateReqInput), type(obj)
        self._engine._alive()
        CALLS.append(("end_weight_update", None))
        if not self.session_open:
            return False, "no weight-update session is open; call begin_weight_update() first"
        self.session_open = False
        return True, "Success"

    async def update_weights_from_tensor(self, obj: Any, request: Optional[Any] = None) -> tuple[bool, str]:
        from sglang.srt.managers.io_struct import UpdateWeightsFromTensorReqInput
        from sglang.srt.utils import MultiprocessingSerializer

        assert isinstance(obj, UpdateWeightsFromTensorReqInput), type(obj)
        eng = self._engine
        eng._alive()
        if hasattr(type(self), "begin_weight_update") and not self.session_open:
            return False, ("update_weights_from_tensor must run between "
                           "begin_weight_update() and end_weight_update()")
        if "weights" in self.released:
            return False, "FAKE sglang: weights are released (resume_memory_occupation first)"
        tp = eng.server_args.get("tp_size", 1)
        if len(obj.serialized_named_tensors) != tp:
            return False, f"expected {tp} serialized payloads (one per TP rank), got {len(obj.serialized_named_tensors)}"
        payloads = [MultiprocessingSerializer.deserialize(p) for p in obj.serialized_named_tensors]
        named = payloads[0]
        for name, t in named:
            if name not in eng.weights:
                return False, f"FAKE sglang: no parameter named {name!r} in the model"
            if tuple(t.shape) != tuple(eng.weights[name].shape):
                return False, f"FAKE sglang: shape mismatch for {name}: {tuple(t.shape)} vs {tuple(eng.weights[name].shape)}"
        for name, t in named:
            eng.weights[name] = t.detach().to("cpu", copy=True).float()
        eng.checksum = _checksum(eng.weights)
        CALLS.append(("update_weights_from_tensor", {"names": [n for n, _ in named], "flush_cache": obj.flush_cache}))
        return True, "Success"

    async def load_lora_adapter_from_tensors(self, obj: Any, _: Optional[Any] = None) -> Any:
        from sglang.srt.managers.io_struct import LoadLoRAAdapterFromTensorsReqInput, LoRAUpdateOutput
        from sglang.srt.utils import MultiprocessingSerializer

        assert isinstance(obj, LoadLoRAAdapterFromTensorsReqInput), type(obj)
        eng = self._engine
        eng._alive()
        if not eng.server_args.get("enable_lora"):
            return LoRAUpdateOutput(success=False, error_message="LoRA is not enabled. Please set `--enable-lora` to enable LoRA.")
        tp = eng.server_args.get("tp_size", 1)
        if len(obj.serialized_named_tensors) != tp:
            return LoRAUpdateOutput(success=False, error_message=f"expected {tp} payloads, got {len(obj.serialized_named_tensors)}")
        tensors = [MultiprocessingSerializer.deserialize(p) for p in obj.serialized_named_tensors][0]
        if not isinstance(tensors, dict):
            return LoRAUpdateOutput(success=False, error_message="FAKE sglang: tensors must be a dict name -> tensor")
        err = eng._add_lora(obj.lora_name, dict(obj.config_dict), tensors)
        CALLS.append(("load_lora_adapter_from_tensors", {"name": obj.lora_name, "names": sorted(tensors)}))
        if err:
            return LoRAUpdateOutput(success=False, error_message=err)
        return LoRAUpdateOutput(success=True, loaded_adapters={n: "__tensor__" for n in eng.loras})

    async def unload_lora_adapter(self, obj: Any, _: Optional[Any] = None) -> Any:
        from sglang.srt.managers.io_struct import LoRAUpdateOutput, UnloadLoRAAdapterReqInput

        assert isinstance(obj, UnloadLoRAAdapterReqInput), type(obj)
        eng = self._engine
        eng._alive()
        CALLS.append(("unload_lora_adapter", obj.lora_name))
        if obj.lora_name not in eng.loras:  # real: the registry's unregister raises
            return LoRAUpdateOutput(success=False, error_message=f"LoRA adapter {obj.lora_name} is not registered")
        del eng.loras[obj.lora_name]
        return LoRAUpdateOutput(success=True, loaded_adapters={n: "__tensor__" for n in eng.loras})

    async def flush_cache(self, timeout_s: Optional[float] = None) -> Any:
        CALLS.append(("flush_cache", None))
        return True


class Engine:
    """``sglang.Engine`` (FAKE; see the module docstring)."""

    def __init__(self, **kwargs: Any) -> None:
        unknown = sorted(set(kwargs) - SERVER_ARGS_FIELDS)
        if unknown:
            raise TypeError(f"Unexpected keyword argument {unknown[0]!r}")
        args = {"tp_size": 1, "dtype": "auto", "enable_memory_saver": False, "trust_remote_code": False, **kwargs}
        if args["dtype"] not in DTYPES:
            raise ValueError(f"invalid dtype {args['dtype']!r}")
        if args.get("enable_deterministic_inference"):  # srt/arg_groups/overrides.py _deterministic_attention_backend
            backend = args.get("attention_backend")
            if backend is None:
                args["attention_backend"] = "fa3"  # the real fallback on Hopper and older GPUs
            elif backend not in DETERMINISTIC_ATTENTION_BACKEND_CHOICES:
                raise ValueError(
                    f"Currently only {DETERMINISTIC_ATTENTION_BACKEND_CHOICES} attention backends are supported for "
                    f"deterministic inference, but you explicitly specified '{backend}'.")
            args["sampling_backend"] = "pytorch"  # overrides.py _deterministic_sampling_backend
        path = Path(str(args.get("model_path", "")))
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"FAKE sglang: no safetensors weights in {path}")
        from safetensors.torch import load_file
        from transformers import AutoTokenizer

        self.server_args = args
        self.weights: dict[str, Any] = {}
        for f in files:
            self.weights.update({k: v.float() for k, v in load_file(str(f)).items()})
        self.checksum = _checksum(self.weights)
        self.loras: dict[str, str] = {}  # adapter name -> checksum of its tensors
        if args.get("enable_lora") is None and args.get("lora_paths"):  # real: implied by lora_paths
            args["enable_lora"] = True
        for name, folder in _lora_paths(args.get("lora_paths")).items():
            cfg = json.loads((Path(folder) / "adapter_config.json").read_text())
            err = self._add_lora(name, cfg, load_file(str(Path(folder) / "adapter_model.safetensors")), init=True)
            if err:
                raise ValueError(err)
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        self.vocab = len(self.tokenizer)
        self.tokenizer_manager = TokenizerManager(self)
        self.running = 0
        self.dead = False
        self.pid = os.getpid()
        _PROCESS["current"] = self
        _PROCESS["engines"].append(self)
        CALLS.append(("Engine", dict(args)))

    def _add_lora(self, name: str, cfg: dict[str, Any], tensors: dict[str, Any], init: bool = False) -> str | None:
        """lora_manager.validate_new_adapter + load, on names, ranks and target modules."""
        if name in self.loras:
            return f"Failed to load LoRA adapter {name} because it is already loaded"
        rank = int(cfg.get("r", 0))
        cap = self.server_args.get("max_lora_rank")
        if cap is not None and rank > cap and not init:
            return f"LoRA adapter {name} with rank {rank} is incompatible with the current LoRA memory pool (max rank {cap})"
        if not tensors or not all(".lora_A." in k or ".lora_B." in k for k in tensors):
            return f"FAKE sglang: adapter {name}: tensors must be peft's lora_A / lora_B weights"
        self.loras[name] = _checksum({k: v.float() for k, v in tensors.items()})
        return None

    def _alive(self) -> None:
        if self.dead:
            raise RuntimeError("FAKE sglang: the scheduler process is dead (shutdown() killed it)")
        if _PROCESS["current"] is not self:
            raise RuntimeError("FAKE sglang: another sglang.Engine was created in this process; sglang keeps "
                               "one engine's configuration per process (the last one wins)")

    async def async_generate(
        self,
        prompt: Optional[Union[List[str], str]] = None,
        sampling_params: Optional[Union[List[Dict], Dict]] = None,
        input_ids: Optional[Union[List[List[int]], List[int]]] = None,
        image_data: Any = None,
        audio_data: Any = None,
        video_data: Any = None,
        mm_hashes: Any = None,
        mm_content_hashes: Any = None,
        return_logprob: Optional[Union[List[bool], bool]] = False,
        logprob_start_len: Optional[Union[List[int], int]] = None,
        top_logprobs_num: Optional[Union[List[int], int]] = None,
        token_ids_logprob: Optional[Union[List[List[int]], List[int]]] = None,
        lora_path: Optional[List[Optional[str]]] = None,
        custom_logit_processor: Optional[Union[List[str], str]] = None,
        require_reasoning: bool = False,
        return_hidden_states: Any = False,
        return_routed_experts: bool = False,
        routed_experts_start_len: int = 0,
        stream: bool = False,
        bootstrap_host: Optional[Union[List[str], str]] = None,
        bootstrap_port: Optional[Union[List[int], int]] = None,
        bootstrap_room: Optional[Union[List[int], int]] = None,
        routed_dp_rank: Optional[int] = None,
        disagg_prefill_dp_rank: Optional[int] = None,
        kv_hints: Optional[Dict] = None,
        data_parallel_rank: Optional[int] = None,
        external_trace_header: Optional[Dict] = None,
        rid: Optional[Union[List[str], str]] = None,
        session_params: Optional[Dict] = None,
        priority: Optional[int] = None,
        session_id: Optional[str] = None,
        *,
        cache_salt: Optional[Union[List[str], str]] = None,
    ) -> Any:
        self._alive()
        if prompt is not None or stream:
            raise NotImplementedError("FAKE sglang: only input_ids, non-streaming")
        if self.tokenizer_manager.released:
            raise RuntimeError(f"FAKE sglang: generate while memory is released: {sorted(self.tokenizer_manager.released)}")
        single = bool(input_ids) and isinstance(input_ids[0], int)
        batch = [input_ids] if single else list(input_ids or [])
        n = len(batch)
        sps = sampling_params if isinstance(sampling_params, list) else [sampling_params or {}] * n
        lps = return_logprob if isinstance(return_logprob, list) else [bool(return_logprob)] * n
        if len(sps) != n or len(lps) != n:
            raise ValueError("FAKE sglang: sampling_params / return_logprob must match the batch size")
        for sp in sps:
            unknown = sorted(set(sp) - SAMPLING_PARAMS_FIELDS)
            if unknown:
                raise TypeError(f"SamplingParams: unexpected keyword argument {unknown[0]!r}")
        loras = lora_path if isinstance(lora_path, list) else [lora_path] * n
        if len(loras) != n:
            raise ValueError(f"lora_path list length ({len(loras)}) must match batch size ({n})")
        if any(loras) and not self.server_args.get("enable_lora"):
            raise ValueError(f"LoRA adapter '{next(a for a in loras if a)}' was requested, but LoRA is not enabled.")
        for a in loras:
            if a is not None and a not in self.loras:
                raise ValueError(f"Got LoRA adapter that has never been loaded: {a}\nAll loaded adapters: {list(self.loras)}.")
        self.running += 1
        try:
            outs = [self._one(ids, sp, lp, None if a is None else self.loras[a])
                    for ids, sp, lp, a in zip(batch, sps, lps, loras)]
        finally:
            self.running -= 1
        CALLS.append(("async_generate", n))
        return outs[0] if single else outs

    def _one(self, ids: list[int], sp: dict[str, Any], want_lp: bool, lora: str | None = None) -> dict[str, Any]:
        max_new = int(sp.get("max_new_tokens", 128))
        seed = sp.get("sampling_seed")
        eos = self.tokenizer.eos_token_id
        out: list[int] = []
        for step in range(max_new):
            h = hashlib.sha256(f"{ids}|{seed}|{step}|{self.checksum}|{lora}".encode()).digest()
            tok = int.from_bytes(h[:4], "little") % self.vocab
            out.append(tok)
            if tok == eos:
                break
        finish = {"type": "stop", "matched": eos} if out and out[-1] == eos else {"type": "length", "length": len(out)}
        meta: dict[str, Any] = {"prompt_tokens": len(ids), "completion_tokens": len(out), "finish_reason": finish}
        if want_lp:
            meta["output_token_logprobs"] = [(-math.log(self.vocab) * (1 + (t % 7) / 10), t, None) for t in out]
        text = self.tokenizer.decode(out, skip_special_tokens=bool(sp.get("skip_special_tokens", True)))
        return {"text": text, "output_ids": out, "meta_info": meta}

    def _serialize_tensors_per_rank(self, tensors: Any, load_format: Optional[str]) -> List[bytes]:
        from sglang.srt.utils import MultiprocessingSerializer

        return [MultiprocessingSerializer.serialize(tensors) for _ in range(self.server_args.get("tp_size", 1))]

    def flush_cache(self) -> Any:
        return True

    def shutdown(self) -> None:
        """Real: ``kill_process_tree(os.getpid(), include_parent=False)``: every engine of the process dies."""
        for eng in _PROCESS["engines"]:
            eng.dead = True
        CALLS.append(("shutdown", None))


def _lora_paths(v: Any) -> dict[str, str]:
    """``lora_paths`` in the forms ServerArgs accepts: {name: path}, ["name=path" | path], [{lora_name, lora_path}]."""
    if not v:
        return {}
    if isinstance(v, dict):
        return {str(k): str(p) for k, p in v.items()}
    out = {}
    for item in v:
        if isinstance(item, dict):
            out[item["lora_name"]] = item["lora_path"]
        elif "=" in str(item):
            k, p = str(item).split("=", 1)
            out[k] = p
        else:
            out[str(item)] = str(item)
    return out


def _checksum(weights: dict[str, Any]) -> str:
    h = hashlib.sha256()
    for name in sorted(weights):
        h.update(name.encode())
        h.update(weights[name].double().sum().item().hex().encode())
    return h.hexdigest()[:16]
