"""Names a package imports on first use."""

import sys

import pytest

from neorl_industrial.core.utils.lazy import lazy_exports


def test_a_name_imports_its_module_on_first_use_and_dir_lists_every_name():
    getattr_, dir_, names = lazy_exports(
        "neorl_industrial.core.utils", {".messages": ("quote",), "json": ("dumps", "loads")}
    )
    assert names == dir_() == ["dumps", "loads", "quote"]
    from neorl_industrial.core.utils.messages import quote

    assert getattr_("quote") is quote
    assert getattr_("dumps") is sys.modules["json"].dumps
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        getattr_("nothing")


def test_a_name_exported_by_two_modules_is_refused_by_name():
    with pytest.raises(ValueError, match="'dumps' is exported by two modules"):
        lazy_exports("package", {"json": ("dumps",), "pickle": ("dumps",)})
