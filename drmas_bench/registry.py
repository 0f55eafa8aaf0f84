"""One registry type for every kind of named thing: suites, benchmarks, workflows, format rules,
grading families, math graders, engines, pools, commands, export formats, and the trainer's
estimators, policy losses, KL penalties, rollout corrections, advantage metric families, loss
weightings and KL controllers (tests/test_registry_dicts.py finds a dict standing in for one).

    ENGINES = Registry("engine", error=EngineError)
    ENGINES.register("hf", "drmas_bench.engines.hf:HFEngine")   # lazy: imported when first asked for

    WORKFLOWS = Registry("workflow")
    @WORKFLOWS.register("toy")          # as a decorator: registers the function, returns it
    def toy(ep): ...

    WORKFLOWS.get("toy")                # the object; an unknown name is one line listing the known ones
    "toy" in WORKFLOWS, list(WORKFLOWS), WORKFLOWS.names()

A name is registered once: a second registration of the same name is refused (the same object
again is allowed, so a module imported twice under two names does no harm). An entry may be a
``"module:object"`` string, imported on first use (``lazy=True``, the default for a string), so a
registry of heavy things (an engine that imports torch) costs nothing until one is used. A registry
filled by the suites is frozen once they are discovered (``drmas_bench.suites.discovery``): what a command
lists is what it runs; a late registration (a module imported mid-run) is refused, and a test that
registers its own entry does so inside ``with REGISTRY.unfrozen():``.

A leaf: it imports nothing of the project but ``types`` (lm-eval's ``lm_eval/api/registry.py`` and
Inspect's ``_util/registry.py`` have the same shape).
"""

from __future__ import annotations

import importlib
from contextlib import contextmanager
from typing import Any, Callable, Generic, Iterator, TypeVar, overload

from drmas_bench.types import UserError

T = TypeVar("T")
_MISSING: Any = object()  # no default given


class DeclarationError(UserError, ValueError):
    """A suite's declaration refused where it is made (a field of the wrong kind, a needed option
    missing): one line, printed as it is (a ValueError too, for callers that catch those)."""


class RegistryError(DeclarationError):
    """A registration refused: a name registered twice, or a registration after the registry froze."""


_SUITE_FILLED: list[Registry[Any]] = []  # the registries the suites fill (frozen after discovery)


def freeze_suite_registries() -> None:
    """Freeze every registry the suites fill (``discovery.discover`` calls this once they are imported)."""
    for reg in _SUITE_FILLED:
        reg.freeze()


def resolve(ref: str) -> Any:
    """The object a ``"module:object"`` reference names (``object`` may be dotted), its module imported."""
    module, _, attr = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class Registry(Generic[T]):
    """Named entries of one kind (``kind`` is how messages name one: "workflow", "engine", ...).

    error: the exception class of an unknown name (a ``UserError`` by default; the trainer's
        registries keep ``ValueError``, which their config validators turn into one line);
    hints: {name: why} for names that once meant something else, refused with that hint;
    filled_by_suites: the suites fill it, so discovery freezes it once they are all in
        (:func:`freeze_suite_registries`)."""

    def __init__(self, kind: str, *, error: type[Exception] = UserError, hints: dict[str, str] | None = None,
                 filled_by_suites: bool = False) -> None:
        if filled_by_suites:
            _SUITE_FILLED.append(self)
        self.kind = kind
        self.error = error
        self.hints = dict(hints or {})
        self._entries: dict[str, Any] = {}  # name -> object, or "module:object" not yet imported
        self._lazy: set[str] = set()
        self._alias_of: dict[str, str] = {}  # alias -> the name it was registered with
        self._frozen = False

    # ------------------------------------------------------------------ filling it

    @overload
    def register(self, name: str, *, aliases: tuple[str, ...] = ()) -> Callable[[T], T]: ...

    @overload
    def register(self, name: str, entry: T | str, *, aliases: tuple[str, ...] = ()) -> T | str: ...

    def register(self, name: str, entry: Any = None, *, aliases: tuple[str, ...] = ()) -> Any:
        """Register ``entry`` under ``name`` (and ``aliases``), returning it; without ``entry``, a
        decorator doing the same for what it decorates. A string entry with a ``:`` is a lazy
        ``"module:object"`` reference. A name already registered to another entry is refused."""
        if entry is None:
            def deco(obj: T) -> T:
                self.register(name, obj, aliases=aliases)
                return obj
            return deco
        self._check_open(name)
        self._check_names(name, aliases)
        for key in (name, *aliases):
            old = self._entries.get(key)
            if key in self._entries and old is not entry and not (isinstance(entry, str) and old == entry):
                raise RegistryError(f"{self.kind} {key!r} registered twice")
        for key in (name, *aliases):
            self._entries[key] = entry
            if isinstance(entry, str) and ":" in entry:
                self._lazy.add(key)
        self._alias_of.update((a, name) for a in aliases)
        return entry

    def _check_names(self, name: str, aliases: tuple[str, ...]) -> None:
        """Refuse a name or alias that would clash: an alias that is already a name (or another
        name's alias, or its own name, or given twice), a name that is already an alias, and either
        one equal to a renamed name (it would silently give the old name a new meaning). The same
        registration again (a module imported twice) passes."""
        for key in (name, *aliases):
            if key in self.hints:
                raise RegistryError(f"{self.kind} {key!r} is a renamed name ({self.hints[key]}); pick another")
        if name in self._alias_of:
            raise RegistryError(f"{self.kind} {name!r} is already an alias of {self._alias_of[name]!r}")
        for a in aliases:
            if a == name or aliases.count(a) > 1:
                raise RegistryError(f"{self.kind} {name!r}: alias {a!r} given twice (or equal to the name)")
            owner = self._alias_of.get(a, a if a in self._entries else None)
            if owner is not None and owner != name:
                what = "a name" if owner == a else f"an alias of {owner!r}"
                raise RegistryError(f"{self.kind} alias {a!r} of {name!r} is already {what}")

    def __setitem__(self, name: str, entry: T | str) -> None:
        """``REGISTRY[name] = entry`` replaces what ``name`` holds: the deliberate override a test
        double or a worker process uses (``monkeypatch.setitem`` works); code registers with
        :meth:`register`, which refuses a name twice."""
        aliases = self._aliases(name)  # an override keeps the names it answers to
        self.unregister(name)
        self.register(name, entry, aliases=aliases)

    def __delitem__(self, name: str) -> None:
        self.unregister(name)

    def unregister(self, name: str) -> None:
        """Remove ``name`` and its aliases (a test's own entry, when it is done); an alias removes
        only itself; a missing name is no error."""
        self._check_open(name)
        for key in (name, *self._aliases(name)):
            self._entries.pop(key, None)
            self._lazy.discard(key)
            self._alias_of.pop(key, None)

    def _aliases(self, name: str) -> tuple[str, ...]:
        return tuple(a for a, owner in self._alias_of.items() if owner == name)

    def freeze(self) -> None:
        """No registration from now on (``discovery`` freezes what the suites fill once they are in)."""
        self._frozen = True

    @property
    def frozen(self) -> bool:
        return self._frozen

    @contextmanager
    def unfrozen(self) -> Iterator[Registry[T]]:
        """Registration allowed again inside the block (a test registering its own entry)."""
        was, self._frozen = self._frozen, False
        try:
            yield self
        finally:
            self._frozen = was

    def _check_open(self, name: str) -> None:
        if self._frozen:
            raise RegistryError(f"{self.kind} {name!r}: the {self.kind} registry is frozen (its entries are registered "
                                f"when the suites are discovered; a test registers inside `with REGISTRY.unfrozen():`)")

    # ------------------------------------------------------------------ reading it

    def get(self, name: str, default: Any = _MISSING) -> T:
        """The entry ``name`` (a lazy one imported now); an unknown name is one line listing the known
        ones (or ``default`` when one is given, as a dict's ``get``)."""
        if name not in self._entries and default is not _MISSING:
            return default
        if name not in self._entries:
            hint = f" ({self.hints[name]})" if name in self.hints else ""
            raise self.error(f"unknown {self.kind} {name!r}{hint}; known: {', '.join(self._entries) or 'none'}")
        if name in self._lazy:
            ref = self._entries[name]
            obj = resolve(ref)
            for key in [k for k in self._lazy if self._entries[k] == ref]:
                self._entries[key] = obj
                self._lazy.discard(key)
        return self._entries[name]

    def find(self, name: str | None) -> T | None:
        """The entry ``name``, None when there is none (or no name)."""
        return self.get(name) if name and name in self._entries else None

    def entry(self, name: str) -> Any:
        """What was registered under ``name`` as it stands: the object, or its ``"module:object"``
        string while it is not imported yet (what a worker process is sent to register the same)."""
        if name not in self._entries:
            self.get(name)  # the one-line error
        return self._entries[name]

    def __getitem__(self, name: str) -> T:
        if name not in self._entries:
            raise KeyError(name)
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        """The registered names (aliases included), in the order they were registered."""
        return list(self._entries)

    def items(self) -> list[tuple[str, T]]:
        """(name, entry) pairs, lazy entries imported."""
        return [(n, self.get(n)) for n in list(self._entries)]

    def values(self) -> list[T]:
        return [v for _, v in self.items()]

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._entries)})"
