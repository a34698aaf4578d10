"""The project's modules import each other one way: no module reaches, directly or through
others, back to itself, and no package does (shared/ sits below the trainer packages: it reaches
them only through shared/trainers.py's registry). Every import counts, module-level and inside
functions alike."""

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("shared", "dtensor_impl", "mirrored_impl", "release_matrix")


def project_modules() -> dict:
    """{module name: path} for compare.py and every module of the three packages."""
    modules = {"compare": os.path.join(ROOT, "compare.py")}
    for package in PACKAGES:
        for name in sorted(os.listdir(os.path.join(ROOT, package))):
            if name.endswith(".py") and name != "__init__.py":
                modules[f"{package}.{name[:-3]}"] = os.path.join(ROOT, package, name)
    return modules


def imported_project_modules(path: str, modules: dict) -> set:
    """Project modules that `path` imports anywhere in its code (`from shared import report` counts)."""
    found = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name in modules}


def import_graph() -> dict:
    modules = project_modules()
    return {name: imported_project_modules(path, modules) for name, path in modules.items()}


def find_cycle(graph: dict):
    """One cycle as a list of modules [a, b, ..., a], or None (depth-first search)."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                return stack[stack.index(target) :] + [target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def package_graph(graph: dict) -> dict:
    """{package: the other packages its modules import}; compare.py is a package of its own."""
    packages = {}
    for module, imported in graph.items():
        package = module.split(".")[0]
        packages.setdefault(package, set()).update(name.split(".")[0] for name in imported)
    return {package: targets - {package} for package, targets in packages.items()}


def test_the_import_graph_sees_the_known_edges():
    graph = import_graph()
    assert "shared.comparison" in graph["compare"] and "shared.multiclient" in graph["compare"]
    assert "shared.comparison" in graph["shared.multiclient"]  # the launcher uses the comparison
    assert "shared.plots" in graph["shared.report"]  # report writes the plots
    assert "dtensor_impl.mesh" in graph["dtensor_impl.trainer"]
    assert package_graph(graph)["dtensor_impl"] == {"shared"}


def test_the_project_has_no_import_cycle():
    assert find_cycle(import_graph()) is None, " -> ".join(find_cycle(import_graph()))


def test_no_package_imports_back_into_another_that_imports_it():
    packages = package_graph(import_graph())
    assert find_cycle(packages) is None, " -> ".join(find_cycle(packages))


def test_a_package_cycle_is_found_even_when_the_modules_do_not_cycle():
    """shared.report -> dtensor_impl.mesh -> shared.errors: no module cycle, a package one."""
    graph = {"shared.report": {"dtensor_impl.mesh"}, "dtensor_impl.mesh": {"shared.errors"}, "shared.errors": set()}
    assert find_cycle(graph) is None
    assert find_cycle(package_graph(graph)) == ["dtensor_impl", "shared", "dtensor_impl"]


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]


def test_module_docstrings_say_what_and_where_in_at_most_15_lines():
    """A module's docstring says what it holds and points to docs/ for the rest (STYLE.md)."""
    long = {}
    for name, path in project_modules().items():
        docstring = ast.get_docstring(ast.parse(open(path).read(), path), clean=False) or ""
        lines = len(docstring.strip("\n").splitlines())
        if lines > 15 and name.split(".")[0] in ("shared", "dtensor_impl", "mirrored_impl"):
            long[name] = lines
    assert long == {}
