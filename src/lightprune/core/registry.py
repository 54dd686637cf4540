"""One registry class for every kind of named extension: expert criteria, model families, width scorers and
calibration statistics; and `Configured`, the base of the extensions whose constructor is their config.

A `Registry` maps a name to a class. Built-in entries may be *declared* as ``"package.module:Class"``
strings (`Registry.declare`): their names are known without importing anything (the command line checks a
criterion's name before torch loads), and the class is imported when first asked for. Project code registers with
`Registry.register`, usually through a decorator the owning package exposes (``register_criterion``,
``register_family``, ...). Registering a name twice is an error unless it is the same class again (also after a
module reload: same module and qualified name), which replaces the entry. `Registry.resolve` and
`Registry.build` turn what a user or a config gives (a registered name, a dotted import path
``"package.module.ClassName"``, a class, an instance) into a class or an instance, with errors that name the value
and what is accepted.

A leaf: it imports nothing of lightprune and no third-party package.
"""

from __future__ import annotations

import importlib
import inspect
import operator
import re
from collections.abc import Mapping
from contextlib import contextmanager
from typing import Any, Callable, Generic, Iterator, TypeVar

__all__ = ["Registry", "NotASubclassError", "SNAKE_CASE", "same_class", "Configured"]

#: names of criteria, width scorers and statistics: lower-case snake case
SNAKE_CASE = re.compile(r"^[a-z][a-z0-9_]*$")

T = TypeVar("T")


class NotASubclassError(TypeError, ValueError):
    """A class, or the dotted import path of one, that is not a subclass of the registry's base; a ValueError too,
    so that the command reports it as a bad input, in one line."""


def same_class(a: type, b: type) -> bool:
    """The same class, or its reloaded twin (same module and qualified name)."""
    return a is b or (a.__module__ == b.__module__ and a.__qualname__ == b.__qualname__)


class Registry(Generic[T]):
    """``name -> class`` for one ``kind`` of extension (the word errors use: "criterion", "width scorer", ...).

    ``base()``, when given, returns the class every entry must subclass (a function, so that a torch-free registry
    names a base defined beside torch). ``check(name, cls)``, when given, raises for a class that may not be
    registered (instead of the base check). ``pattern``: what a name must match (None: any non-empty string).
    ``hint``: appended as given to the error for an unknown name (how to add one, say; with its own leading
    punctuation). ``name_attribute``: the class attribute registration sets to the name ("name"; None: none).
    ``clash``: what the error for a name registered to another class tells the user to do (``{name}``: the name).
    """

    def __init__(self, kind: str, *, base: Callable[[], type] | None = None,
                 check: Callable[[str, Any], None] | None = None, pattern: re.Pattern[str] | None = SNAKE_CASE,
                 hint: str = "", name_attribute: str | None = None,
                 clash: str = "choose another name or unregister {name!r} first"):
        self.kind, self._base, self._check, self._pattern, self._hint = kind, base, check, pattern, hint
        self._name_attribute, self._clash = name_attribute, clash
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
        return self.register_all((name,), cls)

    def register_all(self, names: tuple[str, ...], cls: T) -> T:
        """Register ``cls`` under every one of ``names``, or under none when one of them may not be."""
        for name in names:
            self._check_name(name)
            if self._check is not None:
                self._check(name, cls)
            elif self._base is not None and not (isinstance(cls, type) and issubclass(cls, self._base())):
                raise TypeError(f"{self.kind} {name!r} must be a {self._base().__name__} subclass, got {cls!r}")
            existing = self._classes.get(name)
            if existing is not None and not same_class(existing, cls):
                raise ValueError(f"{self.kind} {name!r} is already registered to {existing.__module__}."
                                 f"{existing.__qualname__}; {self._clash.format(name=name)}")
        for name in names:
            self._classes[name] = cls
            if self._name_attribute is not None:
                setattr(cls, self._name_attribute, name)
        return cls

    def decorator(self, name: str) -> Callable[[T], T]:
        """``@registry.decorator("name")``: `register` as a class decorator."""
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

    def resolve(self, spec: Any) -> T:
        """The class for a registered name, a dotted import path ``"package.module.ClassName"`` or a class."""
        base = self._base() if self._base is not None else object
        if isinstance(spec, type):
            if not issubclass(spec, base):
                raise NotASubclassError(f"{spec!r} is not a {base.__name__} subclass")
            return spec
        if not isinstance(spec, str):
            raise TypeError(f"a {self.kind} is a registered name, a dotted import path, a {base.__name__} subclass "
                            f"or instance; got {spec!r} ({type(spec).__name__})")
        if spec in self or "." not in spec:
            return self.get(spec)
        module, _, attribute = spec.rpartition(".")
        try:
            found = getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError) as err:
            raise ValueError(f"cannot import {self.kind} {spec!r}: {err}") from err
        if not (isinstance(found, type) and issubclass(found, base)):
            raise NotASubclassError(f"{self.kind} {spec!r} is not a registered {self.kind} name or a {base.__name__} "
                                    f"subclass (it is {found!r}); it was not built")
        return found

    def build(self, spec: Any, **kwargs: Any) -> Any:
        """An instance of ``spec`` (see `resolve`; an instance is returned as is) built with ``kwargs``; an
        argument the constructor does not take is a ``TypeError`` listing the ones it does."""
        if self._base is not None and isinstance(spec, self._base()):
            if kwargs:
                raise ValueError(f"got arguments {sorted(kwargs)} for an already built {self.kind} {spec!r}")
            return spec
        cls = self.resolve(spec)
        signature = inspect.signature(cls)
        try:
            signature.bind(**kwargs)
        except TypeError as err:
            allowed = [p for p in signature.parameters if p not in ("args", "kwargs")]
            label = getattr(cls, self._name_attribute, "") if self._name_attribute else ""
            raise TypeError(f"{self.kind} {label or cls.__name__!r}: {err}; its arguments are: "
                            f"{', '.join(allowed) if allowed else '(none)'}") from None
        return cls(**kwargs)

    def view(self) -> Mapping[str, T]:
        """The registry read as a mapping ``name -> class`` (sorted by name, declared entries imported when read);
        it changes only through the registry."""
        return _View(self)

    def items(self) -> Iterator[tuple[str, T]]:
        """``(name, class)`` of every entry, declared ones imported."""
        return iter(self.view().items())

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


class _View(Mapping):
    """`Registry.view`."""

    def __init__(self, registry: Registry[Any]):
        self._registry = registry

    def __getitem__(self, name: str) -> Any:
        if name not in self._registry:
            raise KeyError(name)
        return self._registry.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._registry

    def __iter__(self) -> Iterator[str]:
        return iter(self._registry.names())

    def __len__(self) -> int:
        return len(self._registry.names())

    def __repr__(self) -> str:
        return f"{self._registry.kind} registry view {dict(self)!r}"


class Configured:
    """The constructor is the config: subclasses take typed keyword arguments, validate them in ``__init__`` with
    errors that name the bad value, and keep each under an attribute of the same name; `hparams` and
    ``repr`` read them back, so an instance is reported exactly as it was built."""

    @property
    def hparams(self) -> dict[str, Any]:
        """The constructor arguments, read back from attributes of the same name."""
        params = inspect.signature(type(self).__init__).parameters
        return {p: getattr(self, p) for p in params
                if p != "self" and params[p].kind not in (params[p].VAR_POSITIONAL, params[p].VAR_KEYWORD)
                and hasattr(self, p)}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.hparams.items())})"

    @staticmethod
    def _check_int(name: str, value: Any, minimum: int | None = None) -> int:
        """``value`` as an int: a Python or NumPy integer (a 0-d integer tensor too), never a bool or a float."""
        try:
            number = None if isinstance(value, bool) or "bool" in str(getattr(value, "dtype", "")) else \
                operator.index(value)
        except TypeError:
            number = None
        if number is None:
            raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
        if minimum is not None and number < minimum:
            raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
        return number
