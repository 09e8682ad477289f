"""Names a package resolves on first use (PEP 562), so that a process loads only what it uses.

The top level, ``model``, ``objectives``, ``analysis`` and ``search`` export their public names this way:
``import loopscale``, the analysis and a simulated sweep's driver load no torch, and the command line's parser
neither scipy nor matplotlib. A name exported this way must not be a submodule's name too: importing the submodule
would bind it in the package, hiding the export. It lives in ``model``, the package every other one may import
(tests/test_import_graph.py).
"""

from __future__ import annotations

import sys
from importlib import import_module


def on_first_use(package: str, exports: dict[str, str]):
    """The module-level ``(__getattr__, __dir__)`` of ``package``: each name of ``exports`` is imported from its
    submodule (named relative to ``package``) when first used, then kept in the package's namespace."""
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(f"{package}.{exports[name]}"), name)
        namespace[name] = value  # resolve once
        return value

    def __dir__() -> list[str]:
        return sorted(exports)

    return __getattr__, __dir__
