"""The package's docstring examples run, one test per module.

They are collected here, not by pytest's ``--doctest-modules`` over ``service/``: pytest would import those files
under the directory's name (``service.app``), a second copy of each module beside the installed
``perceptron_stream`` one.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import perceptron_stream
import pytest


def _modules() -> list[str]:
    names = [perceptron_stream.__name__]
    names += [info.name for info in pkgutil.walk_packages(perceptron_stream.__path__, prefix="perceptron_stream.")]
    return sorted(names)


MODULES = _modules()


def test_every_module_is_found():
    """The walk reaches the subpackages (a broken walk would make every test below pass on nothing)."""
    assert {"perceptron_stream.learning.perceptron", "perceptron_stream.state.pending.table"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name} (output above)"
