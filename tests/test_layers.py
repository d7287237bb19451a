"""The layers, enforced (as trio does): no import cycles between drainpipe's modules, the pipeline, server, Spark and
and no module uses another module's private names; every public exception lives in errors.py, modules are loaded by name only
in the lazy package faces, and tests import only public names."""

from __future__ import annotations

import ast
import builtins
import functools
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "drainpipe"
#: packages built on the queue: they may import ``drainpipe`` (the public API) and each other, never ``drainpipe._*``
CLIENTS = ("drainpipe.pipeline", "drainpipe.server", "drainpipe.spark", "drainpipe.inputs", "drainpipe.kafka")
#: where the optional C extensions are built and imported (drainpipe/native/__init__.py: the native tiers)
NATIVE = "drainpipe.native"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()
#: the C extensions, by the source each is built from (setup.py names each after its source's path)
EXTENSIONS = {".".join(p.relative_to(SRC).with_suffix("").parts) for p in PACKAGE.rglob("*.c")}
IMPORTABLE = set(MODULES) | EXTENSIONS


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    is_package = MODULES[module].name == "__init__.py"
    base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


@functools.cache
def _tree(module: str) -> ast.Module:
    """``module``'s syntax tree, parsed once per run: the checks below walk every module's, several times over (each
    parsing them anew made over a thousand parses of the same files, 4 s). The walks only read the trees."""
    return ast.parse(MODULES[module].read_text(), str(MODULES[module]))


def _imports(module: str) -> list[tuple[str, list[str], int]]:
    """(imported module, names imported from it, line) for every import in ``module``, at any depth."""
    tree = _tree(module)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, [], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node)
            names = [alias.name for alias in node.names]
            # (``from . import _jsonscan``: a C extension is a module imported, not a private name)
            submodules = [f"{target}.{n}" for n in names if f"{target}.{n}" in IMPORTABLE]
            found.append((target, [n for n in names if f"{target}.{n}" not in IMPORTABLE], node.lineno))
            found += [(sub, [], node.lineno) for sub in submodules]
    return [(t, names, line) for t, names, line in found if t == "drainpipe" or t.startswith("drainpipe.")]


def _graph() -> dict[str, set[str]]:
    return {m: {t for t, _, _ in _imports(m) if t in MODULES and t != m} for m in MODULES}


def test_no_import_cycles() -> None:
    graph = _graph()
    # a package's __init__ importing its own submodules is how packages are built, not a cycle through them
    edges = {
        m: {t for t in ts if not (t.startswith(m + ".") and MODULES[m].name == "__init__.py")}
        for m, ts in graph.items()
    }
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(edges[m]):
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t) :] + [t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_clients_use_the_queue_only_through_its_public_api() -> None:
    bad = [
        f"{m}:{line} imports {t}"
        for m in MODULES
        if m.startswith(CLIENTS)
        for t, _, line in _imports(m)
        if t.count(".") and t.split(".")[1].startswith("_")
    ]
    assert not bad, bad


def test_no_module_uses_another_modules_private_names() -> None:
    bad = []
    for m in MODULES:
        for target, names, line in _imports(m):
            if target == m:
                continue
            bad += [f"{m}:{line} imports {target}.{n}" for n in names if n.startswith("_") and n != "__version__"]
            # private modules belong to the queue core: only drainpipe itself and its own _modules import them (and
            # drainpipe.native, which reports the queue core's C extension among the native tiers, importing it as
            # the core does: the core cannot run without it, so it is no tier the callers choose)
            last = target.rsplit(".", 1)[-1]
            if (
                last.startswith("_")
                and target.count(".") == 1
                and not (m == "drainpipe" or m.startswith("drainpipe._") or m in ("drainpipe.cli", NATIVE))
            ):
                bad.append(f"{m}:{line} imports the private module {target}")
    assert not bad, bad


def _extension_importers(imports: dict[str, list[tuple[str, list[str], int]]]) -> list[str]:
    """``module:line imports extension`` for every import of an optional C extension outside drainpipe.native."""
    return [
        f"{m}:{line} imports {t}"
        for m, found in imports.items()
        if m != NATIVE
        for t, _, line in found
        if t in EXTENSIONS and t.startswith(NATIVE + ".")
    ]


def test_only_native_imports_the_optional_c_extensions() -> None:
    """The native tiers are loaded in one place: every optional C extension is built in drainpipe.native and imported
    only there; callers ask it (``native.jsonscan``, ``native.enabled(...)``), so that ``native.disabled(...)`` turns
    a tier off for all of them. (The queue core's own ``_fastpath`` is required and imported by the core.)"""
    assert not [e for e in EXTENSIONS if not e.startswith(NATIVE + ".") and e != "drainpipe._fastpath"], EXTENSIONS
    bad = _extension_importers({m: _imports(m) for m in MODULES})
    assert not bad, bad


def test_the_layering_checks_can_fail() -> None:
    """The checks above see what they look for: the queue imports its internals, and the CLI the server."""
    assert "drainpipe._control" in _graph()["drainpipe._queue"]
    assert "drainpipe.server.commands" in _graph()["drainpipe.cli"]
    assert any(t == "drainpipe._fastpath" for t, _, _ in _imports("drainpipe._partitions"))
    assert any(t == "drainpipe.native._jsonscan" for t, _, _ in _imports(NATIVE))
    assert _extension_importers({"drainpipe.x": [("drainpipe.native._jsonscan", [], 3)]}) == [
        "drainpipe.x:3 imports drainpipe.native._jsonscan"
    ]


# --------------------------------------------------------------------------------------------- exceptions, loading

ERRORS = "drainpipe.errors"
#: builtin exception bases a class may name; any other base is checked by name against the classes found here
_BUILTIN_EXCEPTIONS = {name for name in dir(builtins) if name.endswith(("Error", "Exception", "Exit"))} | {
    "Exception",
    "BaseException",
}


def _exception_classes(tree: ast.Module) -> list[tuple[str, int]]:
    """(class name, line) of every class in ``tree`` deriving from an exception, by its bases' names (a builtin
    exception, or a class of drainpipe.errors)."""
    known = _BUILTIN_EXCEPTIONS | {n.name for n in ast.walk(_tree(ERRORS)) if isinstance(n, ast.ClassDef)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            bases = {b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases}
            if bases & known:
                found.append((node.name, node.lineno))
    return found


def _public_exceptions_outside_errors(sources: dict[str, str]) -> list[str]:
    return [
        f"{module}:{line} defines {name}"
        for module, text in sources.items()
        if module != ERRORS
        for name, line in _exception_classes(ast.parse(text))
        if not name.startswith("_")  # a private control-flow class may stay local
    ]


def test_every_public_exception_is_in_errors() -> None:
    bad = _public_exceptions_outside_errors({m: p.read_text() for m, p in MODULES.items()})
    assert not bad, bad


def _loads_by_name(text: str) -> list[int]:
    """Lines calling importlib.import_module, __import__ or importlib.util's loaders."""
    lines = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name in ("import_module", "__import__", "spec_from_file_location", "module_from_spec"):
                lines.append(node.lineno)
    return lines


def _is_lazy_face(module: str) -> bool:
    """A package ``__init__`` that imports its names on first use (a module-level ``__getattr__``)."""
    return MODULES[module].name == "__init__.py" and any(
        isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in _tree(module).body
    )


def test_modules_are_loaded_by_name_only_in_the_lazy_package_faces() -> None:
    """Loading a module by name hides the import from the cycle check above (the PostgreSQL store was loaded so,
    while it imported the module that loaded it). Only the package faces, which import on first use, may."""
    bad = [
        f"{m}:{line} loads a module by name"
        for m, path in MODULES.items()
        if not _is_lazy_face(m)
        for line in _loads_by_name(path.read_text())
    ]
    assert not bad, bad


def test_no_public_name_of_a_lazy_face_is_also_a_submodule() -> None:
    """Importing ``pkg.x`` sets the attribute ``x`` of ``pkg`` to the module, replacing a lazily exported ``x``
    (``from drainpipe.pipeline import render`` gave the module once ``pipeline.render`` had been imported)."""
    bad = []
    for m in MODULES:
        if _is_lazy_face(m):
            exported = next(
                (
                    ast.literal_eval(n.value)
                    for n in _tree(m).body
                    if isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in n.targets)
                ),
                [],
            )
            bad += [f"{m}.{name}" for name in exported if f"{m}.{name}" in MODULES]
    assert not bad, bad


# --------------------------------------------------------------------------------------------- tests use public names

TESTS = Path(__file__).resolve().parent


def _private_imports(text: str) -> list[str]:
    """``module.name`` for every private name imported from a public drainpipe module. A private module's names
    may be imported: such a test is that module's own unit test."""
    bad = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "drainpipe":
            if any(part.startswith("_") for part in node.module.split(".")):
                continue
            package = SRC.joinpath(*node.module.split("."))
            bad += [
                f"{node.module}.{a.name}"
                for a in node.names
                if a.name.startswith("_")
                and a.name != "__version__"
                and not any(package.joinpath(a.name + ext).exists() for ext in (".py", ".c"))  # a private module
            ]
    return bad


def test_tests_import_only_public_names() -> None:
    bad = [
        f"{path.relative_to(TESTS)} imports {name}"
        for path in sorted(TESTS.rglob("*.py"))
        for name in _private_imports(path.read_text())
    ]
    assert not bad, bad


def test_the_new_checks_can_fail() -> None:
    """Each rule above flags the thing it forbids (sabotaged inputs: the checks are not vacuous)."""
    assert _public_exceptions_outside_errors({"drainpipe.x": "class Oops(ValueError):\n    pass\n"}) == [
        "drainpipe.x:1 defines Oops"
    ]
    assert _public_exceptions_outside_errors({"drainpipe.x": "class Gone(StoreError):\n    pass\n"})
    assert not _public_exceptions_outside_errors({"drainpipe.x": "class _Stop(Exception):\n    pass\n"})
    assert _loads_by_name("import importlib\nm = importlib.import_module('drainpipe.x')\n") == [2]
    assert _private_imports("from drainpipe.inputs.records import _secret\n") == ["drainpipe.inputs.records._secret"]
    assert not _private_imports("from drainpipe._balancer import _plan\n")  # a private module's unit test
    assert not _private_imports("from drainpipe.native import _spanmap\n")
    assert _is_lazy_face("drainpipe.pipeline") and not _is_lazy_face("drainpipe.pipeline.store")
