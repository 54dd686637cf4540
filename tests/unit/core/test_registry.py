"""The one registry class: declared entries imported on first use, registration rules, errors, restoring."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from lightprune.core.registry import Registry, same_class


class Base:
    pass


def _check(name, cls):
    if not (isinstance(cls, type) and issubclass(cls, Base)):
        raise TypeError(f"{name}: not a Base")


def test_register_get_and_the_rules_for_a_name_registered_twice() -> None:
    registry = Registry("widget", check=_check, hint=" (see the docs)")

    class A(Base):
        pass

    class B(Base):
        pass

    assert registry.register("a", A) is A and registry.get("a") is A and "a" in registry
    assert registry.register("a", A) is A  # the same class again
    twin = type("A", (Base,), {"__module__": A.__module__, "__qualname__": A.__qualname__})
    assert same_class(twin, A) and registry.register("a", twin) is twin  # its reloaded twin replaces it
    with pytest.raises(ValueError, match="widget 'a' is already registered to .*A; choose another name"):
        registry.register("a", B)
    with pytest.raises(TypeError, match="b: not a Base"):
        registry.register("b", dict)
    with pytest.raises(ValueError, match="lower-case snake case"):
        registry.register("Bad Name", B)
    with pytest.raises(ValueError, match=r"^unknown widget 'nope'; available: a \(see the docs\)$"):
        registry.get("nope")
    assert registry.decorator("b")(B) is B and registry.names() == ["a", "b"]
    assert registry.unregister("b") is B and registry.names() == ["a"]
    with pytest.raises(KeyError, match="no widget named 'b'; registered: a"):
        registry.unregister("b")


def test_restoring_puts_every_entry_back() -> None:
    registry = Registry("widget")

    class A:
        pass

    registry.register("a", A)
    registry.declare("lazy", "collections:OrderedDict")
    with registry.restoring():
        registry.unregister("a")
        registry.unregister("lazy")
        registry.register("c", A)
        assert registry.names() == ["c"]
    assert registry.names() == ["a", "lazy"]


def test_a_declared_entry_is_known_by_name_and_imported_on_first_use(tmp_path) -> None:
    (tmp_path / "declared_widgets.py").write_text(textwrap.dedent("""
        import sys
        IMPORTED = True
        class Widget:
            pass
        class Other:
            pass
    """))
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from lightprune.core.registry import Registry
        registry = Registry("widget")
        registry.declare("w", "declared_widgets:Widget")
        assert registry.names() == ["w"] and "w" in registry and "declared_widgets" not in sys.modules
        import declared_widgets
        assert registry.get("w") is declared_widgets.Widget
        registry.declare("x", "declared_widgets:Widget")
        registry.register("x", declared_widgets.Other)   # its module registered another class under the name
        try:
            registry.get("x")
        except ValueError as err:
            print(err)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "widget 'x' is declared as declared_widgets.Widget, but declared_widgets.Other registered it"


def test_a_declaration_names_module_and_attribute() -> None:
    with pytest.raises(ValueError, match="declare it as 'module:attribute'"):
        Registry("widget").declare("w", "declared_widgets.Widget")


def test_the_view_reads_the_registry_as_a_mapping() -> None:
    registry = Registry("widget")

    class A:
        pass

    view = registry.view()
    assert dict(view) == {} and "a" not in view
    registry.register("a", A)
    registry.declare("od", "collections:OrderedDict")
    import collections

    assert list(view) == ["a", "od"] and len(view) == 2 and view["a"] is A and view["od"] is collections.OrderedDict
    with pytest.raises(KeyError):
        view["nope"]  # noqa: B018
    with pytest.raises(TypeError):
        view["b"] = A  # type: ignore[index]


def test_register_all_registers_every_name_or_none() -> None:
    registry = Registry("widget", clash="unregister_widget({name!r}) first")

    class A:
        pass

    class B:
        pass

    registry.register("b", B)
    with pytest.raises(ValueError, match=r"widget 'b' is already registered to .*B; unregister_widget\('b'\) first"):
        registry.register_all(("a", "b"), A)
    assert registry.names() == ["b"]
    assert registry.register_all(("a", "c"), A) is A and registry.names() == ["a", "b", "c"]
