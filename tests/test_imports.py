"""Imports run one way, down the layers: a module imports its own layer and lower ones, never a higher one
(shared/__init__.py says each folder's rule), directly, inside a function or by name (`importlib.import_module`,
a `-m shared...` command, a registry's module names), and none reaches back to itself. The trainer packages sit
at the training layer; the run layer reaches them only through shared/training/registry.py. Every import names
the project's modules by its unique name (`dtensor_vs_mirrored.shared...`): a user's own `shared` never mixes in."""

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("shared", "dtensor_impl", "mirrored_impl", "release_matrix")
UNIQUE = "dtensor_vs_mirrored."  # the import name that holds shared/, dtensor_impl/ and mirrored_impl/
# Lowest first. A module may import its own layer and those below it.
LAYERS = [
    (
        "process",
        ["shared.config", "shared.option", "shared.errors", "shared.console", "shared.files", "shared.devices"],
    ),
    ("model", ["shared.model"]),
    ("measure", ["shared.measure"]),
    ("judge", ["shared.judge"]),  # below training: judging never trains
    ("training", ["shared.training", "dtensor_impl", "mirrored_impl"]),
    ("report", ["shared.report"]),
    ("run", ["shared.run"]),
    ("entry points", ["shared.api", "shared.cli", "shared.export", "compare", "release_matrix"]),
]


def project_modules() -> dict:
    """{module name: path} for compare.py and every module of the packages, subpackages included."""
    modules = {"compare": os.path.join(ROOT, "compare.py")}
    for package in PACKAGES:
        for directory, _, files in os.walk(os.path.join(ROOT, package)):
            dotted = os.path.relpath(directory, ROOT).replace(os.sep, ".")
            for name in sorted(files):
                if name.endswith(".py"):
                    modules[dotted if name == "__init__.py" else f"{dotted}.{name[:-3]}"] = os.path.join(
                        directory, name
                    )
    return modules


def imported_project_modules(path: str, modules: dict, source: str = "") -> set:
    """Project modules that `path` (or `source`) imports anywhere in its code (`from dtensor_vs_mirrored.shared.report
    import tables` counts, as shared.report.tables), and those it names in a string: an `importlib.import_module("...")`
    argument, a `-m` command's module, a registry's module names. A module naming itself (its own `-m` command) does
    not count."""
    found = {name.removeprefix(UNIQUE) for name in named_modules(path, source)}
    own = {name for name, module_path in modules.items() if module_path == path}
    return {name for name in found if name in modules} - own


def named_modules(path: str, source: str = "") -> set:
    """Every module name `path` (or `source`) imports or names in a string outside its docstrings, as written."""
    found = set()
    tree = ast.parse(source or open(path).read(), path)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            found.add(node.value)
    return found


def bare_imports(path: str, modules: dict, source: str = "") -> set:
    """The project modules `path` imports by their folder's name (`from shared.config import Config`): in a user's
    repository with a `shared` package of its own, that name is theirs. release_matrix is the repository's own
    tooling, run from its root."""
    tree = ast.parse(source or open(path).read(), path)
    written = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    written |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    return {name for name in written if name in modules and not name.startswith(("compare", "release_matrix"))}


def import_graph() -> dict:
    modules = project_modules()
    return {name: imported_project_modules(path, modules) for name, path in modules.items()}


def layer_of(module: str) -> int:
    """The index in LAYERS of the longest prefix that names `module`'s layer; a package's __init__ is its own."""
    if module == "shared":  # the package's own __init__: its docstring only
        return 0
    best, length = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > length:
                best, length = index, len(prefix)
    if best is None:
        raise AssertionError(f"{module} is in no layer of tests/test_imports.py's LAYERS")
    return best


def wrong_way(graph: dict) -> list:
    """Every (importer, imported) pair whose imported module sits in a higher layer."""
    return sorted(
        (module, target)
        for module, targets in graph.items()
        for target in targets
        if target != "shared" and layer_of(target) > layer_of(module)
    )


def find_cycle(graph: dict):
    """One cycle as a list of modules [a, b, ..., a], or None (depth-first search)."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph.get(node, ())):
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


def test_the_import_graph_sees_the_known_edges():
    graph = import_graph()
    assert "shared.cli" in graph["compare"]  # the command's file: its code is the package's
    assert "shared.run.comparison" in graph["shared.cli"] and "shared.run.clients" in graph["shared.cli"]
    assert "shared.run.sequence" in graph["shared.run.clients"]  # the launcher trains through the one sequence
    assert "shared.report.plots" in graph["shared.report.outputs"]  # outputs writes the plots
    assert "dtensor_impl.mesh" in graph["dtensor_impl.trainer"]
    assert "shared.model.definition" in graph["shared.model"]  # a package's __init__ counts as a module


def test_every_import_of_the_project_uses_its_unique_name():
    """Product, tests and examples: `from dtensor_vs_mirrored.shared.config import Config`, not `from shared.config`."""
    modules = project_modules()
    sources = {**product_sources(), **sources_of_tests()}
    assert {name: found for name, path in sources.items() if (found := bare_imports(path, modules))} == {}
    source = (
        "from shared.config import Config\nimport dtensor_vs_mirrored.shared.errors\nfrom release_matrix import table\n"
    )
    assert bare_imports(sources["compare.py"], modules, source) == {"shared.config"}


def test_every_module_sits_in_a_layer_and_imports_only_its_own_and_lower_ones():
    graph = import_graph()
    assert [layer_of(module) for module in graph]  # raises for a module in no layer
    assert wrong_way(graph) == []


def test_the_judge_imports_neither_training_nor_run():
    graph = import_graph()
    judged = {target for module, targets in graph.items() if module.startswith("shared.judge") for target in targets}
    assert not {target for target in judged if target.startswith(("shared.training", "shared.run"))}


def test_a_wrong_way_import_is_found():
    """A judge module importing the training loop, and a model importing data: both are named."""
    graph = import_graph()
    graph["shared.judge.verdict"] = graph["shared.judge.verdict"] | {"shared.training.loop"}
    graph["shared.model.mlp"] = graph["shared.model.mlp"] | {"shared.training.data"}
    assert wrong_way(graph) == [
        ("shared.judge.verdict", "shared.training.loop"),
        ("shared.model.mlp", "shared.training.data"),
    ]
    assert wrong_way({"shared.run.sweep": {"shared.judge.ranking"}, "shared.judge.ranking": set()}) == []


def test_the_project_has_no_import_cycle():
    assert find_cycle(import_graph()) is None, " -> ".join(find_cycle(import_graph()))


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]


def test_shared_holds_at_most_10_modules_at_its_top_and_only_layer_folders():
    """The process layer's six (config.py and option.py, how its options are declared, errors.py, console.py,
    files.py, devices.py), the package's __init__ and the entry points (api.py, cli.py, export.py); everything
    else in a layer's folder."""
    top = sorted(name for name in os.listdir(os.path.join(ROOT, "shared")) if name.endswith(".py"))
    folders = sorted(
        name
        for name in os.listdir(os.path.join(ROOT, "shared"))
        if os.path.isfile(os.path.join(ROOT, "shared", name, "__init__.py"))
    )
    assert len(top) <= 10, top
    assert folders == sorted(prefix.split(".")[1] for _, prefixes in LAYERS[1:7] for prefix in prefixes[:1])


def test_nothing_under_shared_asks_a_trainer_for_an_optional_part():
    """The contract is code (shared/training/protocol.py): no `getattr(trainer...` or `getattr(trainer_module(`."""
    offenders = [
        name
        for name, path in project_modules().items()
        if name.startswith("shared")
        and any(probe in open(path).read() for probe in ("getattr(trainer", "getattr(self.trainer"))
    ]
    assert offenders == []


def test_every_trainer_is_registered_by_its_spec_and_offers_the_whole_contract():
    from dtensor_vs_mirrored.shared.training.protocol import Trainer
    from dtensor_vs_mirrored.shared.training.registry import SPEC_MODULES, trainer_spec

    for name in SPEC_MODULES:  # --trainers' choices: the registry's names, each its spec's
        spec = trainer_spec(name)
        assert spec.name == name and issubclass(spec.trainer, Trainer)
        assert not spec.trainer.__abstractmethods__, (name, spec.trainer.__abstractmethods__)
        assert (spec.cluster is None) == (not spec.distributes)  # every distributed trainer runs as --clients
    assert {"begin", "before_save", "finish", "gradients", "train_epoch", "test_step"} <= set(vars(Trainer))


def test_a_trainer_that_leaves_an_attribute_unset_cannot_be_made():
    from dtensor_vs_mirrored.shared.training.reference import ReferenceTrainer

    class Forgetful(ReferenceTrainer):
        def __init__(self):
            self.name = "forgetful"

    try:
        Forgetful()
    except TypeError as error:
        assert str(error) == (
            "Forgetful sets no placement, details, collectives, model, optimizer, checkpointed "
            "(shared.training.protocol.Trainer)"
        )
    else:
        raise AssertionError("a trainer without its attributes was made")


def test_the_run_layer_imports_no_trainer_package():
    graph = import_graph()
    reached = {
        target
        for module, targets in graph.items()
        if module.startswith("shared.run")
        for target in targets
        if target.startswith(("dtensor_impl", "mirrored_impl", "shared.training.reference"))
    }
    assert reached == set()
    assert {"dtensor_impl.spec", "mirrored_impl.spec"} <= graph["shared.training.trainer_names"]  # found by name
    assert "shared.training.trainer_names" in graph["shared.training.registry"]


def test_a_module_named_in_a_string_is_an_import():
    """`importlib.import_module("shared.run.sequence")` in a judge module is a wrong-way import, as is a `-m`
    command; a docstring that names a module is not."""
    modules = project_modules()
    path = modules["shared.judge.verdict"]
    source = (
        '"""Mentions shared.run.sequence in its docstring."""\n'
        "import importlib\n"
        'importlib.import_module("shared.run.sequence")\n'
        'COMMAND = ["python", "-m", "shared.run.worker"]\n'
    )
    named = imported_project_modules(path, modules, source)
    assert named == {"shared.run.sequence", "shared.run.worker"}
    graph = import_graph()
    graph["shared.judge.verdict"] = graph["shared.judge.verdict"] | named
    assert wrong_way(graph) == [
        ("shared.judge.verdict", "shared.run.sequence"),
        ("shared.judge.verdict", "shared.run.worker"),
    ]


MAX_DOCSTRING_LINES = 15  # what a module is for, its command and the costs that shape it; figures go to docs/


def product_sources() -> dict:
    """{path relative to ROOT: path} for every .py file of the product: all but tests/ and hidden or build folders
    (.venv, .nox, out)."""
    return python_sources(ROOT, skipped=("tests", "out", "build"))


def sources_of_tests() -> dict:
    """{path relative to ROOT: path} for every .py file under tests/."""
    return python_sources(os.path.join(ROOT, "tests"))


def python_sources(top: str, skipped=()) -> dict:
    """{path relative to ROOT: path} for every .py file under `top`, but in hidden folders and those `skipped`."""
    sources = {}
    for directory, folders, files in os.walk(top):
        folders[:] = sorted(f for f in folders if not f.startswith((".", "_")) and f not in skipped)
        for name in sorted(files):
            if name.endswith(".py"):
                sources[os.path.relpath(os.path.join(directory, name), ROOT)] = os.path.join(directory, name)
    return sources


def long_module_docstrings(sources: dict) -> dict:
    """{path: line count} of each module docstring longer than MAX_DOCSTRING_LINES."""
    long = {}
    for name, path in sources.items():
        docstring = ast.get_docstring(ast.parse(open(path).read(), path), clean=False) or ""
        lines = len(docstring.strip("\n").splitlines())
        if lines > MAX_DOCSTRING_LINES:
            long[name] = lines
    return long


def test_module_docstrings_say_what_and_where_in_at_most_15_lines():
    """A module's docstring says what it holds and points to docs/ for the rest, where the measurements live:
    every module of the product, entry points and examples included."""
    sources = product_sources()
    assert {"compare.py", "noxfile.py", "examples/keras_fit.py", "release_matrix/split_classes.py"} <= set(sources)
    assert not any(name.startswith(("tests", ".")) for name in sources)
    assert long_module_docstrings(sources) == {}


def test_the_docstring_count_sees_a_long_docstring(tmp_path):
    path = tmp_path / "long.py"
    path.write_text('"""' + "line\n" * 16 + '"""\n')
    assert long_module_docstrings({"long.py": str(path)}) == {"long.py": 16}
    path.write_text('"""' + "line\n" * 14 + 'line"""\n')
    assert long_module_docstrings({"long.py": str(path)}) == {}


MAX_FUNCTION_LINES = 50  # a function longer than this is split where its parts have names of their own
MAX_TRAINER_LINES = 450  # a trainer file says where tensors live and how gradients combine; the rest is shared


def test_no_product_function_runs_past_50_lines_and_no_trainer_file_past_450():
    long = {}
    for name, path in project_modules().items():
        for node in ast.walk(ast.parse(open(path).read(), path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{name}.{node.name}"] = lines
    assert long == {}
    for trainer in ("dtensor_impl/trainer.py", "mirrored_impl/trainer.py", "shared/training/reference.py"):
        assert len(open(os.path.join(ROOT, trainer)).read().splitlines()) <= MAX_TRAINER_LINES, trainer


MAX_PARAMETERS = 8  # a function that needs more takes a plan object (a small frozen dataclass), STYLE.md 21


def parameter_count(node) -> int:
    """Positional and keyword parameters, self and cls left out; *args and **kwargs one each."""
    arguments = node.args
    named = [a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs]
    return len([name for name in named if name not in ("self", "cls")]) + sum(
        1 for star in (arguments.vararg, arguments.kwarg) if star is not None
    )


def many_parameters(source: str, path: str = "<source>") -> dict:
    """{function name: its parameter count} for each function of `source` taking more than MAX_PARAMETERS."""
    return {
        node.name: parameter_count(node)
        for node in ast.walk(ast.parse(source, path))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and parameter_count(node) > MAX_PARAMETERS
    }


def test_the_parameter_count_counts_keywords_and_stars_but_not_self():
    source = (
        "def eight(a, b, c, d, e, f, g, h): pass\n"
        "def nine(a, b, /, c, d, *args, e, f=1, g=2, **kwargs): pass\n"
        "class Plan:\n"
        "    def method(self, a, b, c, d, e, f, g, h): pass\n"
        "    def lambda_free(cls, a, b, c, d, e, f, g, *, h, i): pass\n"
    )
    assert many_parameters(source) == {"nine": 9, "lambda_free": 9}


def test_no_product_function_takes_more_than_8_parameters():
    many = {}
    for name, path in project_modules().items():
        many.update(
            {f"{name}.{function}": count for function, count in many_parameters(open(path).read(), path).items()}
        )
    assert many == {}


def own_statements(scope):
    """The statements of a module or function, those inside its blocks too, but not inside a nested def or class."""
    stack = list(scope.body)
    while stack:
        statement = stack.pop()
        yield statement
        if not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            stack.extend(child for child in ast.iter_child_nodes(statement) if isinstance(child, ast.stmt))


def state_on_functions(source: str, path: str = "<source>") -> list:
    """ "line function.attribute" for each attribute assigned to a function defined in the same scope; a wrapper's
    dunders and what it forwards of the wrapped one's interface (`call.x = traced.x`) are not state."""
    hung = []
    for scope in ast.walk(ast.parse(source, path)):
        if not isinstance(scope, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        statements = list(own_statements(scope))
        functions = {s.name for s in statements if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}
        for statement in filter(lambda s: isinstance(s, ast.Assign), statements):
            for target in statement.targets:
                if not (isinstance(target, ast.Attribute) and getattr(target.value, "id", None) in functions):
                    continue
                forwarded = isinstance(statement.value, ast.Attribute) and statement.value.attr == target.attr
                if not (target.attr.startswith("__") or forwarded):
                    hung.append(f"{statement.lineno} {target.value.id}.{target.attr}")
    return hung


def test_state_on_a_function_object_is_found_in_its_scope_only():
    source = (
        "def outer():\n"
        "    def train(): pass\n"
        "    with open('x'):\n"
        "        train.process = 1\n"
        "    train.__doc__ = outer.__doc__\n"
        "    train.get = other.get\n"
        "    return train\n"
        "def run(): pass\n"
        "def judge(run):\n"
        "    run.baseline = 2\n"
    )
    assert state_on_functions(source) == ["4 train.process"]


def test_no_product_code_hangs_state_on_a_function_object():
    """`train.process = process`: what a closure carries besides being called belongs to an object that says so."""
    hung = {name: found for name, path in project_modules().items() if (found := state_on_functions(open(path).read()))}
    assert hung == {}
