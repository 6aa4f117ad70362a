"""Running the code of a given source tree: the ``--tree`` of bench/decoder.py, own_work.py and parts.py, and
bench/e2e.py's ``--service-tree``.

A tree's package is its ``service/`` directory, which pyproject.toml's
package-dir maps to the import name ``perceptron_stream``: with the tree
itself on the path, ``import perceptron_stream`` finds nothing there and
imports the installed package, whatever the tree. So a directory of ours holds
one entry, a symlink ``perceptron_stream`` -> ``TREE/service``, and goes first
on the path (``sys.path`` here, ``PYTHONPATH`` for a child process).
"""

from __future__ import annotations

import hashlib
import sys
import tempfile
from pathlib import Path


def import_root(tree: Path) -> Path:
    """A directory from which ``import perceptron_stream`` imports ``tree``'s code (made once per tree, kept in the
    temporary directory: its one entry is a symlink to ``tree/service``)."""
    service = tree.resolve() / "service"
    if not (service / "__init__.py").is_file():
        raise SystemExit(f"{tree}: not a source tree of perceptron-stream (no service/__init__.py)")
    root = (
        Path(tempfile.gettempdir()) / "perceptron-stream-trees" / hashlib.sha1(str(service).encode()).hexdigest()[:16]
    )
    link = root / "perceptron_stream"
    if not link.is_symlink():
        root.mkdir(parents=True, exist_ok=True)
        try:
            link.symlink_to(service, target_is_directory=True)
        except FileExistsError:  # another run made it meanwhile
            pass
    return root


def use_tree(tree: Path) -> Path:
    """Import ``perceptron_stream`` from ``tree`` in this process (before anything imported it); the path of the
    package's ``__init__.py`` as imported, which is checked to lie in ``tree/service``."""
    if "perceptron_stream" in sys.modules:
        raise RuntimeError("perceptron_stream was imported before use_tree(): it would not be the tree's")
    sys.path.insert(0, str(import_root(tree)))
    import perceptron_stream

    imported = Path(perceptron_stream.__file__ or "").resolve()
    if not imported.is_relative_to(tree.resolve() / "service"):
        raise RuntimeError(f"perceptron_stream imported from {imported}, not from {tree}/service")
    return imported
