"""The package's import layering, checked on the source (every import, lazy ones inside functions included;
``if TYPE_CHECKING:`` blocks excluded, they never run):

- a package imports only from its own layer or the layers below it (docs/architecture.md);
- no import cycles between modules;
- no library code writes ``os.environ`` (child processes get their environment passed to them);
- no function body is longer than ``MAX_FUNCTION_LINES`` (a function fits a screen; docstrings not counted).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import inttrain

SRC = Path(inttrain.__file__).parent

#: Bottom to top. ``inttrain`` is the package root (``inttrain.prepare_`` & co., lazily re-exported).
LAYERS: tuple[frozenset[str], ...] = tuple(map(frozenset, (
    {"spec", "report", "models", "oplib"},
    {"numerics", "schedules", "micro", "data"},
    {"kernels"},
    {"autograd", "integer_only"},
    {"nn", "optim"},
    {"recipes", "cost", "distributed"},
    {"api", "inference", "inttrain"},
    {"trainer", "integrations"},
    {"cli", "__main__"},
)))
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}

#: Module cycles allowed: none.
ALLOWED_CYCLES: list[frozenset[str]] = []


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_nodes(tree: ast.AST):
    """Every node except those under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


@functools.cache  # parsed once for the tests below
def imports(root: Path) -> dict[str, list[tuple[str, int]]]:
    """module -> [(imported inttrain module, line)] for every ``.py`` under ``root`` (the package folder)."""
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    out: dict[str, list[tuple[str, int]]] = {}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        found = []
        for node in _runtime_nodes(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            for t in targets:
                while t not in files and "." in t:
                    t = t.rsplit(".", 1)[0]
                if t in files and t != mod:
                    found.append((t, node.lineno))
        out[mod] = found
    return out


def _layer(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def upward_imports(graph: dict[str, list[tuple[str, int]]]) -> list[str]:
    bad = []
    for mod, targets in graph.items():
        for target, line in targets:
            a, b = _layer(mod), _layer(target)
            if a != b and RANK[b] > RANK[a]:
                bad.append(f"{mod}:{line} imports {target} ({a} is below {b})")
    return bad


def cycles(graph: dict[str, list[tuple[str, int]]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w, _ in graph.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(frozenset(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_every_package_has_a_layer() -> None:
    packages = {_layer(m) for m in imports(SRC)}
    assert packages - set(RANK) == set()


def test_no_upward_imports() -> None:
    assert upward_imports(imports(SRC)) == []


def test_no_import_cycles() -> None:
    assert [sorted(c) for c in cycles(imports(SRC)) if c not in ALLOWED_CYCLES] == []


def test_the_checks_catch_violations(tmp_path: Path) -> None:
    """An upward import and a cycle in a throw-away package are reported (the checks can fail)."""
    pkg = tmp_path / "inttrain"
    for sub, text in {"spec/__init__.py": "", "spec/a.py": "from inttrain.trainer import b\n",
                      "trainer/__init__.py": "", "trainer/b.py": "def f():\n    from ..spec import a\n",
                      "trainer/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import b\n"}.items():
        (pkg / sub).parent.mkdir(parents=True, exist_ok=True)
        (pkg / sub).write_text(text)
    graph = imports(pkg)
    assert upward_imports(graph) == ["inttrain.spec.a:1 imports inttrain.trainer.b (spec is below trainer)"]
    assert cycles(graph) == [frozenset({"inttrain.spec.a", "inttrain.trainer.b"})]
    assert graph["inttrain.trainer.c"] == []


def test_library_code_never_writes_os_environ() -> None:
    writes = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            target = None
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
                for t in getattr(node, "targets", None) or [getattr(node, "target", None)]:
                    if isinstance(t, ast.Subscript):
                        target = t.value
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr in ("setdefault", "update", "pop", "clear", "popitem"):
                    target = node.func.value
                elif node.func.attr in ("putenv", "unsetenv"):
                    target = node.func
            if target is not None and "environ" in ast.unparse(target) or (
                    isinstance(target, ast.Attribute) and target.attr in ("putenv", "unsetenv")):
                writes.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert writes == []


#: Longest function body allowed in ``src/inttrain`` (issue 14: "no function over ~80 lines").
MAX_FUNCTION_LINES = 80


def long_functions(root: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``path:line name (n lines)`` of every function whose body, docstring excluded, is longer than ``limit``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = node.body[1:] if ast.get_docstring(node) is not None and len(node.body) > 1 else node.body
                n = node.end_lineno - body[0].lineno + 1
                if n > limit:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({n} lines)")
    return found


def test_no_function_over_the_line_limit() -> None:
    assert long_functions(SRC) == []


def test_the_length_check_counts_body_lines(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "a.py").write_text(f'def ok():\n    """Doc."""\n{body}\n\ndef long():\n{body}    return 0\n')
    assert long_functions(tmp_path) == [f"a.py:{MAX_FUNCTION_LINES + 5} long ({MAX_FUNCTION_LINES + 1} lines)"]
