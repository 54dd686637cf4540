"""One registry class for every kind of named extension: expert criteria, model families, width scorers and
calibration statistics.

A :class:`Registry` maps a name to a class. Built-in entries may be *declared* as ``"package.module:Class"``
strings (:meth:`Registry.declare`): their names are known without importing anything (the command line checks a
criterion's name before torch loads), and the class is imported when first asked for. Project code registers with
:meth:`Registry.register`, usually through a decorator the owning package exposes (``register_criterion``,
``register_family``, ...). Registering a name twice is an error unless it is the same class again (also after a
module reload: same module and qualified name), which replaces the entry.

A leaf: it imports nothing of lightprune and no third-party package.
"""

from __future__ import annotations

import importlib
import re
from contextlib import contextmanager
from typing import Any, Callable, Generic, Iterator, TypeVar

__all__ = ["Registry", "SNAKE_CASE", "same_class"]

#: names of criteria, width scorers and statistics: lower-case snake case
SNAKE_CASE = re.compile(r"^[a-z][a-z0-9_]*$")

T = TypeVar("T")


def same_class(a: type, b: type) -> bool:
    """The same class, or its reloaded twin (same module and qualified name)."""
    return a is b or (a.__module__ == b.__module__ and a.__qualname__ == b.__qualname__)


class Registry(Generic[T]):
    """``name -> class`` for one ``kind`` of extension (the word errors use: "criterion", "width scorer", ...).

    ``check(name, cls)``, when given, raises for a class that may not be registered (a wrong base class).
    ``pattern``: what a name must match (None: any non-empty string). ``hint``: appended as given to the error for
    an unknown name (how to add one, say; with its own leading punctuation).
    """

    def __init__(self, kind: str, *, check: Callable[[str, Any], None] | None = None,
                 pattern: re.Pattern[str] | None = SNAKE_CASE, hint: str = ""):
        self.kind, self._check, self._pattern, self._hint = kind, check, pattern, hint
        self._classes: dict[str, T] = {}
        self._declared: dict[str, str] = {}
        self._verified: set[str] = set()  # declared names whose class was checked against the declaration

    # ------------------------------------------------------------------ registration
    def _check_name(self, name: Any) -> None:
        if not isinstance(name, str) or not name or (self._pattern is not None and not self._pattern.match(name)):
            rule = ("a non-empty string" if self._pattern is None else
                    f"lower-case snake case matching {self._pattern.pattern!r}" if self._pattern is SNAKE_CASE else
                    f"matching {self._pattern.pattern!r}")
            raise ValueError(f"{self.kind} name must be {rule}, got {name!r}")

    def declare(self, name: str, where: str) -> None:
        """A built-in entry known by name now and imported from ``where`` (``"module:attribute"``) on first use."""
        self._check_name(name)
        if ":" not in where:
            raise ValueError(f"{self.kind} {name!r}: declare it as 'module:attribute', got {where!r}")
        self._declared[name] = where

    def register(self, name: str, cls: T) -> T:
        """Register ``cls`` under ``name`` (see the module docstring for a name registered twice)."""
        self._check_name(name)
        if self._check is not None:
            self._check(name, cls)
        existing = self._classes.get(name)
        if existing is not None and not same_class(existing, cls):
            raise ValueError(f"{self.kind} {name!r} is already registered to {existing.__module__}."
                             f"{existing.__qualname__}; choose another name or unregister {name!r} first")
        self._classes[name] = cls
        return cls

    def decorator(self, name: str) -> Callable[[T], T]:
        """``@registry.decorator("name")``: :meth:`register` as a class decorator."""
        self._check_name(name)
        return lambda cls: self.register(name, cls)

    def unregister(self, name: str) -> T:
        """Remove ``name`` (registered or declared) and return its class (for tests and notebooks)."""
        if name not in self:
            raise KeyError(f"no {self.kind} named {name!r}; registered: {', '.join(self.names())}")
        cls = self.get(name)
        self._classes.pop(name, None)
        self._declared.pop(name, None)
        self._verified.discard(name)
        return cls

    # ------------------------------------------------------------------ lookup
    def __contains__(self, name: object) -> bool:
        return name in self._classes or name in self._declared

    def names(self) -> list[str]:
        """Every registered or declared name, sorted (imports nothing)."""
        return sorted(set(self._classes) | set(self._declared))

    def get(self, name: str) -> T:
        """The class of ``name``, importing a declared one; an unknown name is a ``ValueError`` listing the known."""
        if name in self._declared and name not in self._verified:
            module, _, attribute = self._declared[name].partition(":")
            declared = getattr(importlib.import_module(module), attribute)  # its module may register it itself
            if name not in self._classes:
                self.register(name, declared)
            if self._classes[name] is not declared:
                raise ValueError(f"{self.kind} {name!r} is declared as {module}.{attribute}, but "
                                 f"{self._classes[name].__module__}.{self._classes[name].__qualname__} registered it")
            self._verified.add(name)
        if name in self._classes:
            return self._classes[name]
        raise self.unknown(name)

    def unknown(self, name: str) -> ValueError:
        """The error for a name that is not registered: it lists the known names (and the registry's hint)."""
        return ValueError(f"unknown {self.kind} {name!r}; available: {', '.join(self.names()) or '(none)'}{self._hint}")

    def items(self) -> Iterator[tuple[str, T]]:
        """``(name, class)`` of every entry, declared ones imported."""
        for name in self.names():
            yield name, self.get(name)

    @contextmanager
    def restoring(self) -> Iterator[None]:
        """Inside the block, register and unregister freely: the entries are put back as they were on exit (tests,
        notebooks)."""
        classes, declared, verified = dict(self._classes), dict(self._declared), set(self._verified)
        try:
            yield
        finally:
            self._classes.clear()
            self._classes.update(classes)
            self._declared.clear()
            self._declared.update(declared)
            self._verified.clear()
            self._verified.update(verified)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {len(self.names())} entries)"
