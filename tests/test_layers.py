"""Imports run one way, top to bottom (DESIGN.md, "Layout"): no attnkit module imports, at its top or inside a
function, a module that imports it back, directly or through others."""

import ast
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "src"


def module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """attnkit module -> the attnkit modules it imports anywhere in its text (a name imported from a package counts
    as its submodule where there is one of that name, else as the package)."""
    paths = {module_name(path): path for path in SOURCE.rglob("*.py")}
    graph = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        used = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package, up level - 1
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                used |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in paths else base for alias in node.names}
            elif isinstance(node, ast.Import):
                used |= {alias.name for alias in node.names}
        graph[name] = {other for other in used if other in paths and other != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    order, low, stack, found = {}, {}, [], []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        for other in graph[module]:
            if other not in order:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], order[other])
        if low[module] == order[module]:
            component = stack[stack.index(module):]
            del stack[stack.index(module):]
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return found


def test_the_finder_sees_a_circle_through_a_lazy_import():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_attnkit_module_imports_one_that_imports_it_back():
    graph = import_graph()
    assert {"attnkit.text_pipeline", "attnkit.train"} <= graph["attnkit.pretraining"]  # the finder reads the package
    assert not circles(graph), "imports in a circle (move the shared piece to the layer below)"
