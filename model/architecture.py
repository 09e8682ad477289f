"""Bring-your-own architecture: the factory a spec names builds each trial's module.

A spec's ``[template] architecture`` names a factory, ``"package.module:factory"`` (imported) or
``"path/to/file.py:factory"`` (a single file, relative to the spec's folder: ``resolve`` makes it absolute when
the spec is read), and ``[template.options]`` its keyword arguments. The contract::

    factory(config: LoopedConfig, **options) -> torch.nn.Module
    module(idx)          -> logits (B, T, vocab_size)       idx: (B, T) int64 token ids
    module(idx, targets) -> the mean cross-entropy in nats, a 0-d tensor

and, optionally, on the module:

    loopscale_roles()        -> {parameter name: "once" | "loop" | "embed"}, overriding the measured roles
                                (model/measured.py) of the parameters it names
    loopscale_param_groups() -> {"embedding", "lm_head", "matrices", "norms", "lanes": [parameters]}, the
                                optimizer groups (objectives/recipe.py); by default ``param_groups`` below

``BUILTIN`` (``"loopscale:looped"``) is ``LoopedLM``, built through the same interface. A file architecture is
loaded from its path; on a Ray worker that lacks the path (a cluster without a shared file system) it arrives
through Ray's runtime environment (``py_modules``, search/tune/cluster.py) and is imported by its stem.

Every failure is one ``ValueError`` line that names the factory: an unknown module or file, a missing attribute,
a factory that raises or returns no ``torch.nn.Module``, and a file or factory that calls ``sys.exit``: its
``SystemExit`` would end the command with the code it was given, 0 too, and no output, which a batch job takes
for a finished sweep.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib
import importlib.machinery
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn as nn

from .config import BUILTIN, LoopedConfig

_FACTORIES: dict[str, Callable[..., nn.Module]] = {}
MAX_SOURCES = 256  # files an architecture's imports may reach under its folder (``_imported``)


def split(architecture: str) -> tuple[str, str]:
    """``"target:attribute"`` -> (target, attribute); a ValueError line for any other form."""
    target, sep, attribute = architecture.rpartition(":")
    if not sep or not target or not attribute.isidentifier():
        raise ValueError(f"architecture {architecture!r} must read \"package.module:factory\" or "
                         f"\"path/to/file.py:factory\"")
    return target, attribute


def is_file(architecture: str) -> bool:
    return split(architecture)[0].endswith(".py")


def resolve(architecture: str, folder: Path) -> str:
    """The architecture with a file target made absolute against ``folder`` (the spec's); the file must exist."""
    target, attribute = split(architecture)
    if not target.endswith(".py"):
        return architecture
    path = (folder / target).expanduser().resolve()
    if not path.is_file():
        raise ValueError(f"architecture {architecture!r}: no file {path}")
    taken = _module_named(path)
    if taken:
        raise ValueError(f"architecture {architecture!r}: {path.name} is named like {taken}, which a Ray worker "
                         f"would import in its place or lose to it; rename the file")
    return f"{path}:{attribute}"


def _module_named(path: Path) -> str:
    """What else a file named ``path`` would stand for as a top-level module ("" when nothing): a module of the
    standard library, loopscale's own package, or any module importable without the file's folder.

    A Ray worker imports the file by its stem from ``py_modules``, which go first on its path: a ``json.py``
    shadows the json every worker imports (they fail to start and the search hangs after its banner), and a
    ``numpy.py`` loses to the installed numpy, or shadows it. Such a name is refused, before anything starts,
    rather than the file shipped under a private package name: the user's file would then no longer be the
    module its own tracebacks and pickled objects name, and renaming the file is one command."""
    stem = path.stem
    if stem in sys.stdlib_module_names:
        return "a module of Python's standard library"
    if stem == "loopscale":
        return "loopscale's own package"
    elsewhere = [entry for entry in sys.path if Path(entry or ".").resolve() != path.parent]
    found = importlib.machinery.PathFinder.find_spec(stem, elsewhere)
    if found is not None:
        return f"a module already importable from {found.origin or found.submodule_search_locations[0]}"
    return ""


def _module_of(architecture: str):
    target, _ = split(architecture)
    if not target.endswith(".py"):
        try:
            with _loads(architecture):
                return importlib.import_module(target)
        except ImportError as exc:
            raise ValueError(f"architecture {architecture!r}: cannot import {target!r} ({exc})") from None
        except SystemExit as exc:
            raise ValueError(f"architecture {architecture!r}: {target} fails to import: {_failure(exc)}") from None
    path = Path(target)
    if not path.is_file():  # a Ray worker: the file came through runtime_env py_modules, on sys.path
        try:
            return importlib.import_module(path.stem)
        except ImportError:
            raise ValueError(f"architecture {architecture!r}: no file {path}, nor a module {path.stem!r} "
                             f"shipped to this worker") from None
    name = f"loopscale_architecture_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}_{path.stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before running it: dataclasses and pickling look their module up there
        writes, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # no __pycache__ in the user's folder
        try:
            with _loads(architecture):
                spec.loader.exec_module(module)
        except (Exception, SystemExit) as exc:
            del sys.modules[name]
            raise ValueError(f"architecture {architecture!r}: {path.name} fails to import: {_failure(exc)}") from None
        finally:
            sys.dont_write_bytecode = writes
    return sys.modules[name]


# Per architecture, the files of Python code executed while its module was imported (``_loads``): the helpers it
# loads however it loads them (an import statement, ``importlib.import_module`` of a computed name, a file loaded
# by its path, a folder put on ``sys.path``), seen by the audit event every module body's execution raises.
_LOADED: dict[str, set[Path]] = {}
_WATCHING: list[set[str]] = []
_HOOKED: list[bool] = []


def _audit(event: str, args: tuple) -> None:
    if _WATCHING and event == "exec" and getattr(args[0], "co_filename", None):
        _WATCHING[-1].add(args[0].co_filename)


@contextlib.contextmanager
def _loads(architecture: str) -> Iterator[None]:
    """Records in ``_LOADED[architecture]`` the files whose code runs as module bodies while open."""
    if not _HOOKED:
        sys.addaudithook(_audit)  # for the life of the process: an audit hook cannot be removed
        _HOOKED.append(True)
    seen: set[str] = set()
    _WATCHING.append(seen)
    try:
        yield
    finally:
        _WATCHING.remove(seen)
        _LOADED.setdefault(architecture, set()).update(Path(f).resolve() for f in seen if Path(f).is_file())


def factory(architecture: str) -> Callable[..., nn.Module]:
    """The factory an architecture names (loaded once per process)."""
    if architecture == BUILTIN:
        from .looped import LoopedLM

        return LoopedLM
    if architecture not in _FACTORIES:
        module = _module_of(architecture)
        attribute = split(architecture)[1]
        found = getattr(module, attribute, None)
        if not callable(found):
            raise ValueError(f"architecture {architecture!r}: {module.__name__} has no callable {attribute!r}")
        _FACTORIES[architecture] = found
    return _FACTORIES[architecture]


def build(config: LoopedConfig) -> nn.Module:
    """``factory(config, **options)`` of the config's architecture, on the current default device."""
    make = factory(config.architecture)
    try:
        module = make(config, **dict(config.options))
    except (Exception, SystemExit) as exc:
        raise ValueError(f"architecture {config.architecture!r}: the factory failed: {_failure(exc)}") from None
    if not isinstance(module, nn.Module):
        raise ValueError(f"architecture {config.architecture!r}: the factory returned a {type(module).__name__}, "
                         f"not a torch.nn.Module")
    return module


def source_files(architecture: str) -> list[Path]:
    """The files whose source defines the architecture, for the measured accounting's fingerprint: its module's
    file (the package's ``__init__`` for a package) and, transitively, every module of the user's own that its
    source imports (``_imported``)."""
    if architecture == BUILTIN:
        return [Path(__file__).with_name("looped.py")]
    module = _module_of(architecture)
    if not getattr(module, "__file__", None):
        return []
    start = Path(module.__file__).resolve()
    if _installed(start):
        return [start]  # its version pins its helpers
    if is_file(architecture) or "." not in module.__name__ and start.name != "__init__.py":
        base, package = start.parent, None
    else:
        top = importlib.import_module(module.__name__.split(".")[0])
        base, package = Path(top.__file__).resolve().parent.parent, top.__name__
    found = set(_imported(start, base, package))
    for path in sorted(_loaded_with(architecture, module) - found):
        if path.is_relative_to(base) and not _installed(path):
            found |= set(_imported(path, base, package))
    return [start, *sorted(found - {start})]


def _loaded_with(architecture: str, module) -> set[Path]:
    """The files its import ran (``_LOADED``), and those of the modules its namespace holds or takes names from
    (``from helper import Block``: a module imported before, by another route, runs no body again)."""
    files = set(_LOADED.get(architecture, ()))
    for value in vars(module).values():
        owner = value if inspect.ismodule(value) else sys.modules.get(getattr(value, "__module__", None) or "")
        where = getattr(owner, "__file__", None)
        if where and Path(where).is_file():
            files.add(Path(where).resolve())
    return files


def _imported(start: Path, base: Path, package: str | None) -> list[Path]:
    """``start`` and the files its imports reach under ``base``, transitively, in a stable order: the user's
    helper modules. Read from the source (``import a.b``, ``from a import b``, relative imports, also inside
    functions), not from ``sys.modules``: the answer must not depend on what this process imported before, nor
    on whether the factory ran yet. An absolute import is looked up under ``base`` (the architecture file's
    folder, or the folder holding its top-level ``package``, whose name it must then start with), so the
    standard library and installed packages never enter, and neither does an unimported file of the folder.
    A module loaded by a computed name (``importlib.import_module(name)``) is not seen."""
    found, todo = [], [start]
    while todo:
        path = todo.pop()
        if path in found:
            continue
        found.append(path)
        if len(found) > MAX_SOURCES:
            raise ValueError(f"architecture source {start}: its imports reach more than {MAX_SOURCES} files under "
                             f"{base}")
        try:
            tree = ast.parse(path.read_bytes(), str(path))
        except SyntaxError:
            continue  # importing it fails on its own line, if anything imports it
        for node in ast.walk(tree):
            for folder, dotted in _import_targets(node, path, base, package):
                todo += [p for p in _module_files(folder, dotted) if p.is_relative_to(base) and p not in found]
    return [start, *sorted(found[1:])]


def _import_targets(node: ast.AST, path: Path, base: Path, package: str | None) -> list[tuple[Path, list[str]]]:
    """(folder, dotted name as parts) of every module an import statement may load."""
    if isinstance(node, ast.Import):
        names = [alias.name.split(".") for alias in node.names]
        return [(base, parts) for parts in names if package is None or parts[0] == package]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        folder, parts = path.parents[node.level - 1], (node.module or "").split(".") if node.module else []
    elif package is None or (node.module or "").split(".")[0] == package:
        folder, parts = base, node.module.split(".")
    else:
        return []
    return [(folder, parts)] + [(folder, [*parts, alias.name]) for alias in node.names]  # from a import module


def _module_files(folder: Path, parts: list[str]) -> list[Path]:
    """The files importing ``parts`` from ``folder`` runs: each package's ``__init__.py`` and the module's file."""
    files = [folder.joinpath(*parts[:i], "__init__.py") for i in range(1, len(parts) + 1)]
    files.append(folder.joinpath(*parts).with_suffix(".py") if parts else folder / "__init__.py")
    return [f.resolve() for f in files if f.is_file()]


def fingerprint(architecture: str) -> str:
    """sha256 over the architecture's factory (a file by its name, not its folder) and its source, helper
    modules by their path relative to the architecture's file: the same files in another checkout are the same
    architecture, an edited one a new one."""
    target, attribute = split(architecture)
    digest = hashlib.sha256(f"{Path(target).name if target.endswith('.py') else target}:{attribute}".encode())
    files = source_files(architecture)
    for i, path in enumerate(files):
        if i:
            digest.update(os.path.relpath(path, files[0].parent).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def ray_modules(architecture: str) -> list[str]:
    """What a Ray worker must receive to import the architecture (runtime_env ``py_modules``): the file itself,
    or the top-level package of a module imported from outside the installed packages; [] for the built-in and
    for installed packages (every worker has those)."""
    if architecture == BUILTIN:
        return []
    target, _ = split(architecture)
    if target.endswith(".py"):
        return [target]
    top = importlib.import_module(target.split(".")[0])
    location = Path(top.__path__[0]) if hasattr(top, "__path__") else Path(top.__file__)
    return [] if _installed(location) or top.__name__ == "loopscale" else [str(location)]


def _installed(path: Path) -> bool:
    """Under an installed packages' folder (every worker has it, its version fixes its source)."""
    return any(part in ("site-packages", "dist-packages") for part in path.parts)


def roles_asked(module: nn.Module) -> dict[str, str]:
    """``module.loopscale_roles()``, or {} when it has none."""
    own = getattr(module, "loopscale_roles", None)
    return dict(own()) if own is not None else {}


def embed_names(module: nn.Module, vocab_size: int, called: list[str] | None = None) -> set[str]:
    """The parameters of the token embedding and the vocabulary projection (N_embed), tied or not: the weight of
    every ``nn.Embedding`` of ``vocab_size`` rows, and the weight and bias of the ``nn.Linear`` with
    ``vocab_size`` outputs that a forward calls last (the head), unless ``loopscale_roles()`` says otherwise (and
    any it calls "embed"). The head is found by a forward of one 2-token sequence, not by shape: at a width of
    ``vocab_size`` (or an MLP of that width) a block's matrices have the head's shape. A head that is no
    ``nn.Linear`` (a raw parameter used through ``F.linear``) is named "embed" by ``loopscale_roles()``.
    ``called``: what ``vocab_linear_calls`` recorded over a forward already run (measured accounting's), in
    place of that forward."""
    embeddings = [name for name, m in module.named_modules()
                  if isinstance(m, nn.Embedding) and m.num_embeddings == vocab_size]
    head = _last_vocab_linear(module, vocab_size) if called is None else (called[-1] if called else None)
    found = {_qualified(name, "weight") for name in embeddings}
    if head is not None:
        found |= {_qualified(head, p) for p, _ in module.get_submodule(head).named_parameters()}
    asked = roles_asked(module)
    return {name for name in found if asked.get(name, "embed") == "embed"} | {n for n, r in asked.items()
                                                                                if r == "embed"}


def _qualified(module_name: str, param: str) -> str:
    return f"{module_name}.{param}" if module_name else param


@contextlib.contextmanager
def vocab_linear_calls(module: nn.Module, vocab_size: int) -> Iterator[list[str]]:
    """While open, the names of the ``nn.Linear`` with ``vocab_size`` outputs that forwards of ``module`` call,
    in the order called."""
    called: list[str] = []
    handles = [m.register_forward_hook(lambda m, args, out, name=name: called.append(name))
               for name, m in module.named_modules() if isinstance(m, nn.Linear) and m.out_features == vocab_size]
    try:
        yield called
    finally:
        for handle in handles:
            handle.remove()


def _last_vocab_linear(module: nn.Module, vocab_size: int) -> str | None:
    """The name of the last ``nn.Linear`` with ``vocab_size`` outputs that ``module``'s forward calls."""
    if not any(isinstance(m, nn.Linear) and m.out_features == vocab_size for m in module.modules()):
        return None
    device = next(module.parameters()).device
    with vocab_linear_calls(module, vocab_size) as called:
        try:
            with torch.no_grad():
                module(torch.zeros(1, 2, dtype=torch.long, device=device))
        except Exception as exc:
            raise ValueError(f"{type(module).__name__}: forward(idx) of one 2-token sequence, run to find its "
                             f"vocabulary projection, raised {type(exc).__name__}: {_first_line(exc)}") from None
    return called[-1] if called else None


def param_groups(module: nn.Module, vocab_size: int | None) -> dict[str, list[nn.Parameter]]:
    """The optimizer groups of ``module``: its own ``loopscale_param_groups()`` (LoopedLM's is its
    ``param_groups``), else by shape, as LoopedLM's are: the ``embed_names`` go to ``embedding`` (an
    ``nn.Embedding``'s weight) or ``lm_head`` (the rest), other 2-D weights are ``matrices`` (MuonH / Muon), 1-D
    ones ``norms`` and anything else ``lanes`` (AdamW)."""
    own = getattr(module, "loopscale_param_groups", None)
    if own is not None:
        return own()
    if vocab_size is None:
        raise ValueError(f"{type(module).__name__} has no loopscale_param_groups(): its groups by shape need the "
                         f"model's vocab_size")
    embedding = embed_names(module, vocab_size)
    embedding_weights = {id(m.weight) for m in module.modules() if isinstance(m, nn.Embedding)}
    groups: dict[str, list[nn.Parameter]] = {k: [] for k in ("embedding", "lm_head", "matrices", "norms", "lanes")}
    for name, p in module.named_parameters():
        if not p.requires_grad:
            continue
        if name in embedding:
            groups["embedding" if id(p) in embedding_weights else "lm_head"].append(p)
        else:
            groups["matrices" if p.dim() == 2 else "norms" if p.dim() == 1 else "lanes"].append(p)
    return groups


def _failure(exc: BaseException) -> str:
    """What user code raised, in a few words: ``sys.exit(code) was called`` for a ``SystemExit``."""
    if isinstance(exc, SystemExit):
        return f"sys.exit({exc.code!r}) was called"
    return f"{type(exc).__name__}: {_first_line(exc)}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "(no message)"

