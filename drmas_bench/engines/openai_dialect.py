"""What one OpenAI-compatible server takes, learned once: from its OpenAPI schema
(``request_properties``, ``dialect_from_schema``; pure) or from a request it refused
(``adapt_to_refusal``). The facts live in a ``ServerDialect`` (``openai_wire``)."""

from __future__ import annotations

import re
from typing import Any, Callable

from drmas_bench.engines.base import EngineError
from drmas_bench.engines.openai_wire import NEUTRAL_SAMPLING, OpenAIOptions, ServerDialect

_VALIDATION = re.compile(r"validation error|input should|field required|greater than or equal|less than or equal|"
                         r"extra inputs|not permitted|unrecognized request argument|\bloc\b", re.I)


def looks_like_validation_error(resp: Any) -> bool:
    """A 500 whose body names a rejected request field (llama-cpp-python reports its pydantic
    validation errors as HTTP 500): the same request gets the same answer, retrying cannot help."""
    return getattr(resp, "status_code", 0) == 500 and bool(_VALIDATION.search(resp.text or ""))


def _schema_types(schema: Any, defs: dict[str, Any], depth: int = 0) -> set[str]:
    """Every JSON type a (sub)schema allows, items of arrays as ``array<T>``."""
    if not isinstance(schema, dict) or depth > 8:
        return set()
    if "$ref" in schema:
        return _schema_types(defs.get(schema["$ref"].rsplit("/", 1)[-1]), defs, depth + 1)
    out: set[str] = set()
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in schema.get(key) or []:
            out |= _schema_types(sub, defs, depth + 1)
    t = schema.get("type")
    for one in ([t] if isinstance(t, str) else list(t or [])):
        if one == "array":
            out |= {f"array<{x}>" for x in _schema_types(schema.get("items"), defs, depth + 1)} or {"array"}
        else:
            out.add(one)
    return out


def request_properties(doc: Any, path_suffix: str, exclude: str | None = None) -> dict[str, Any] | None:
    """The request-body properties of ``POST ...{path_suffix}`` (not ``...{exclude}``) in an OpenAPI
    document (pure), None when the document does not describe that endpoint's body."""
    if not isinstance(doc, dict):
        return None
    defs = ((doc.get("components") or {}).get("schemas")) or {}
    for path, item in (doc.get("paths") or {}).items():
        path = str(path)
        if not path.endswith(path_suffix) or (exclude and path.endswith(exclude)) or not isinstance(item, dict):
            continue
        content = (((item.get("post") or {}).get("requestBody") or {}).get("content") or {})
        schema = (content.get("application/json") or {}).get("schema")
        for _ in range(8):  # follow $ref / a single anyOf wrapper to the object
            if isinstance(schema, dict) and "$ref" in schema:
                schema = defs.get(schema["$ref"].rsplit("/", 1)[-1])
            elif isinstance(schema, dict) and len(wrapped := schema.get("anyOf") or schema.get("allOf") or []) == 1:
                schema = wrapped[0]
            else:
                break
        if isinstance(schema, dict) and isinstance(schema.get("properties"), dict):
            return {k: {**v, "_types": _schema_types(v, defs)} for k, v in schema["properties"].items()
                    if isinstance(v, dict)}
    return None


def dialect_from_schema(props_completions: dict | None, props_chat: dict | None, o: OpenAIOptions,
                        dialect: ServerDialect) -> None:
    """Fill ``dialect`` from a server's request schemas (pure; tested directly)."""
    props = {**(props_chat or {}), **(props_completions or {})}
    if not props:
        return
    if o.top_k_off == "auto" and o.server_extras:  # (server_extras=False sends no top_k at all)
        tk = props.get("top_k")
        if tk is None:
            dialect.top_k_off, dialect.has_top_k = None, False
            dialect.notes.append("the server's schema has no top_k: none is sent (it has no top-k sampling)")
        else:
            low = tk.get("minimum", tk.get("exclusiveMinimum"))
            if isinstance(low, (int, float)) and low >= 0:
                if low == 0 and "exclusiveMinimum" not in tk:
                    dialect.top_k_off = 0
                    dialect.notes.append("the server's schema takes top_k >= 0 only: \"no top-k\" is sent as top_k=0")
                else:
                    dialect.top_k_off = None
                    dialect.notes.append(f"the server's top_k must be > 0 (default {tk.get('default')}): top-k cannot "
                                         "be switched off there")
    prompt = (props_completions or {}).get("prompt")
    if prompt is not None and not any(t in prompt["_types"] for t in ("array<integer>", "array<array<integer>>")):
        dialect.token_prompt = False
    for name, off in NEUTRAL_SAMPLING.items():
        d = props.get(name, {}).get("default")
        if isinstance(d, (int, float)) and not isinstance(d, bool) and d != off:
            if o.server_extras:
                dialect.neutral[name] = off
                dialect.notes.append(f"server default {name}={d} switched off (sent {name}={off})")
            else:
                dialect.notes.append(f"server default {name}={d} APPLIES (server_extras=False sends no {name})")
    if not o.server_extras and "top_k" in props and props["top_k"].get("default") not in (None, -1, 0):
        dialect.notes.append(f"server default top_k={props['top_k']['default']} APPLIES (server_extras=False sends no top_k)")



def adapt_to_refusal(dialect: ServerDialect, o: OpenAIOptions, resp: Any, body: dict[str, Any], request: Any,
                     url: str, text_prompt_possible: bool, note: Callable[[str], None]) -> bool:
    """A refusal that names a field the engine can do without: learn it into ``dialect`` (each new
    fact through ``note``) and say to send again (True); anything else is the caller's error
    (False). Concurrent calls refused for a field another call has already learned are sent again
    too. ``text_prompt_possible``: a prompt of token ids can be sent as text instead (a tokenizer
    is here). A requested top-k the server refuses is an ``EngineError``."""
    text = resp.text or ""
    if resp.status_code not in (400, 422, 500) or not _VALIDATION.search(text):
        return False
    snippet = " ".join(text.split())[:200]
    changed = False
    if "top_k" in text and "top_k" in body:
        sent = body["top_k"]
        if request.sampling.top_k != -1:
            raise EngineError(f"openai engine: {url} refused top_k={sent} (HTTP {resp.status_code}: {snippet}); "
                              "this server cannot honour the requested top-k")
        if sent != dialect.top_k_off:
            changed = True  # learned meanwhile by another call
        elif o.top_k_off == "auto" and sent == -1:
            dialect.top_k_off = 0
            note(f"the server refused top_k=-1 (HTTP {resp.status_code}): \"no top-k\" is sent as top_k=0")
            changed = True
        elif o.top_k_off == "auto" and sent == 0:
            dialect.top_k_off = None
            note(f"the server refused top_k=-1 and top_k=0 (HTTP {resp.status_code}): no top_k is sent; "
                 "a top-k default of the server's own, if it has one, APPLIES")
            changed = True
    if "prompt" in text and isinstance(body.get("prompt"), list) and text_prompt_possible:
        if dialect.token_prompt:
            dialect.token_prompt = False
            note(f"the server refused a prompt of token ids (HTTP {resp.status_code}: {snippet[:120]}): the "
                 "prompt templated and cut here is sent as text from now on (the server tokenizes it again)")
        changed = True
    return changed
