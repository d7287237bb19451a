"""The layers, enforced (as trio does): no import cycles between drainpipe's modules, the pipeline, server, Spark and
input packages use the queue only through its public API, and no module uses another module's private names."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "drainpipe"
#: packages built on the queue: they may import ``drainpipe`` (the public API) and each other, never ``drainpipe._*``
CLIENTS = ("drainpipe.pipeline", "drainpipe.server", "drainpipe.spark", "drainpipe.inputs")


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    is_package = MODULES[module].name == "__init__.py"
    base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str) -> list[tuple[str, list[str], int]]:
    """(imported module, names imported from it, line) for every import in ``module``, at any depth."""
    tree = ast.parse(MODULES[module].read_text(), str(MODULES[module]))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, [], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node)
            names = [alias.name for alias in node.names]
            submodules = [f"{target}.{n}" for n in names if f"{target}.{n}" in MODULES]
            found.append((target, [n for n in names if f"{target}.{n}" not in MODULES], node.lineno))
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
            # private modules belong to the queue core: only drainpipe itself and its own _modules import them
            last = target.rsplit(".", 1)[-1]
            if (
                last.startswith("_")
                and target.count(".") == 1
                and not (m == "drainpipe" or m.startswith("drainpipe._") or m in ("drainpipe.cli",))
            ):
                bad.append(f"{m}:{line} imports the private module {target}")
    assert not bad, bad


def test_the_layering_checks_can_fail() -> None:
    """The checks above see what they look for: the queue imports its internals, and the CLI the server."""
    assert "drainpipe._control" in _graph()["drainpipe._queue"]
    assert "drainpipe.server.commands" in _graph()["drainpipe.cli"]
    assert any(t == "drainpipe._fastpath" for t, _, _ in _imports("drainpipe._partitions"))
