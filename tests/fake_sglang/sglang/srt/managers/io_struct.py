"""FAKE ``sglang.srt.managers.io_struct`` (tests only): the request structs drmas-bench builds, with
the field names and defaults of sglang 0.5.23 (there ``msgspec.Struct, kw_only=True``: keyword-only,
unknown fields are a ``TypeError``, as with these dataclasses)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Literal, Optional, Union


@dataclass(kw_only=True)
class BeginWeightUpdateReqInput:
    selector: Literal["target", "draft", "all"] = "all"


@dataclass(kw_only=True)
class EndWeightUpdateReqInput:
    pass


@dataclass(kw_only=True)
class UpdateWeightsFromTensorReqInput:
    serialized_named_tensors: List[bytes]
    load_format: Optional[str] = None
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: Optional[str] = None
    selector: Literal["target", "draft", "all"] = "all"
    torch_empty_cache: bool = False


@dataclass(kw_only=True)
class ReleaseMemoryOccupationReqInput:
    tags: Optional[List[str]] = None


@dataclass(kw_only=True)
class ResumeMemoryOccupationReqInput:
    tags: Optional[List[str]] = None


@dataclass(kw_only=True)
class LoadLoRAAdapterFromTensorsReqInput:
    lora_name: str
    config_dict: Dict[str, Any]
    serialized_named_tensors: List[bytes]
    pinned: bool = False
    added_tokens_config: Optional[Dict[str, int]] = None
    lora_id: Optional[str] = None
    load_format: Optional[str] = None
    expected_checksums: Optional[Dict[str, str]] = None


@dataclass(kw_only=True)
class UnloadLoRAAdapterReqInput:
    lora_name: str
    lora_id: Optional[str] = None


@dataclass(kw_only=True)
class LoRAUpdateOutput:
    success: bool
    error_message: Optional[str] = None
    loaded_adapters: Optional[Dict[str, Union[str, Any]]] = None
