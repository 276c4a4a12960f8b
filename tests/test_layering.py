"""The packages import downward only and no module imports itself back through others: the
architecture's table (cso -> csa, packing, microkernels; packing -> microkernels; csa ->
microkernels.dtypes; microkernels -> nothing of ours), the integrations (``cso.onnx``,
``cso.dask``) clients of the core's public API, and ``bench`` on top. Imports inside
functions count: they tie modules together as much as those at the top."""
import ast
import importlib.util
from pathlib import Path

import pytest

PACKAGES = ("microkernels", "csa", "packing", "cso", "bench")
INTEGRATIONS = ("cso.onnx", "cso.dask")
# what an integration may import of the core (cso.layouts: the blocked values' type and layout;
# cso.buffers: the pool of reused arrays)
PUBLIC_CORE = {"cso", "cso.buffers", "cso.jobs", "cso.layouts"}


def _sources():
    """{module name: source path} of every module of our packages, as installed."""
    found = {}
    for package in PACKAGES:
        root = Path(importlib.util.find_spec(package).submodule_search_locations[0])
        for path in sorted(root.rglob("*.py")):
            parts = (package,) + path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if not parts[-1].startswith("test_"):   # bench's pytest-benchmark files
                found[".".join(parts)] = path
    return found


SOURCES = _sources()


def _imports(name, path, text=None):
    """[(line, imported module)] of ``name``'s source (``text``, else ``path``'s), every import
    statement in it, each resolved to the module it loads (``from a import b`` loads ``a.b``
    when that is a module)."""
    is_package = path.name == "__init__.py"
    found = []
    tree = ast.parse(path.read_text() if text is None else text, str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if is_package else name.split(".")[:-1]
                package = package[:len(package) - node.level + 1]
                base = ".".join(package + ([node.module] if node.module else []))
            for alias in node.names:
                target = f"{base}.{alias.name}"
                found.append((node.lineno, target if target in SOURCES else base))
    ours = []
    for line, target in found:
        while target and target not in SOURCES:   # a module of ours, or its package
            target = target.rpartition(".")[0]
        if target and target != name:
            ours.append((line, target))
    return ours


GRAPH = {name: _imports(name, path) for name, path in SOURCES.items()}


def _layer(module):
    """The part of the architecture ``module`` belongs to."""
    for integration in INTEGRATIONS:
        if module == integration or module.startswith(integration + "."):
            return integration
    return module.split(".")[0]


def _allowed(importer, imported):
    layer, target = _layer(importer), _layer(imported)
    if layer == target:
        return True
    if layer in INTEGRATIONS:   # the core's public API, and the other integrations' packages
        return imported in PUBLIC_CORE or imported in INTEGRATIONS
    return {
        "microkernels": False,
        "csa": imported == "microkernels.dtypes",
        "packing": target == "microkernels",
        "cso": target in ("csa", "packing", "microkernels"),
        "bench": True,
    }[layer]


def test_the_sources_were_found():
    assert {"cso.api", "cso.jobs", "cso.host", "cso.onnx.graph", "csa.analysis",
            "microkernels.probe", "packing.filters", "bench.report"} <= set(SOURCES)
    assert ("cso.host" in {m for _, m in GRAPH["cso.api"]}
            and "cso.jobs" in {m for _, m in GRAPH["cso.onnx.kernels"]})


@pytest.mark.parametrize("module", sorted(SOURCES))
def test_imports_point_downward(module):
    wrong = [f"{SOURCES[module]}:{line} imports {imported}" for line, imported in GRAPH[module]
             if not _allowed(module, imported)]
    assert not wrong, f"{module} ({_layer(module)}) imports above or beside its layer: {wrong}"


def test_no_module_imports_itself_back():
    """No circle in the module graph (Tarjan's strongly connected components)."""
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(module):
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for _, imported in GRAPH[module]:
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(GRAPH):
        if module not in index:
            visit(module)
    assert not circles, f"modules that import each other, directly or not: {circles}"


def test_the_checks_catch_what_they_look_for():
    """The rules refuse an upward import and an import of a core internal by an integration,
    and the resolution sees an import inside a function, relative to its package."""
    assert not _allowed("microkernels.probe", "packing")
    assert not _allowed("csa.spec", "microkernels.isa")
    assert not _allowed("cso.onnx.kernels", "cso.prepared")
    assert not _allowed("cso.api", "bench.report")
    assert _allowed("cso.onnx.conv", "cso") and _allowed("cso.dask", "cso.onnx")
    inside = "def f():\n" + "\n" * 8 + "    from .api import Conv2d\n"
    assert _imports("cso.autotune", SOURCES["cso.autotune"], inside) == [(10, "cso.api")]
    assert _imports("cso.onnx", SOURCES["cso.onnx"], "from .. import jobs") == [(1, "cso.jobs")]
