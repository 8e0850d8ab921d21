"""The code's shape, held: imports flow one way, down the floors of the house (every import, those inside functions
and under `if TYPE_CHECKING:` included; no cycle between modules; no module imports a higher floor), the run's stages
read typed settings rather than the config's string keys, the task families stay in their folders, and every module
the layout in docs/development.md names exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from helpers.runs import REPO

PACKAGE = REPO / "src" / "lightbert"
FAMILIES = sorted(p.parent.name for p in (PACKAGE / "tasks").glob("*/head.py"))

# The house from the top floor down: a module may import its own floor and those below, never one above. Each room is
# one kind of thing (docs/development.md draws it).
FLOORS = (
    ("cli",),  # the command line: entry points, checks before Hydra, completion
    ("analysis",),  # finished runs: sweep summaries, reports, the paper's tables, the benchmark
    ("run", "inference", "interop"),  # a run (train, evaluate and the rooms they pass through); predictions; exports
    ("tasks",),  # the task base, the head registry, pre-training, the fine-tuning base and the families
    ("plugins", "checkpoints"),  # what the Trainer is handed; checkpoint files read
    ("data",),  # plumbing every task shares
    # the encoder and its checked architecture; processes and ranks; optimisers and their checked settings; a
    # setting's one home (its typed field); atomic writes
    ("model", "model_config", "cluster", "optim", "optim_config", "settings_fields", "files"),
    ("distributed", "errors", "hub"),  # the ground
)


def floor_of(module: str) -> int:
    room = module.split(".")[1]
    return next(number for number, rooms in enumerate(FLOORS) if room in rooms)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every lightbert module `path` imports, wherever the import stands (a function's body included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("lightbert"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lightbert"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)  # `from package import module`
    return found


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        graph[name] = {m for m in imports(path) if m in modules and m != name}
    return graph


def test_no_module_imports_itself_through_others():
    graph, cycles = import_graph(), []

    def walk(node: str, path: list[str], state: dict[str, int]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt) :] + [nxt])
            elif nxt not in state:
                walk(nxt, [*path, nxt], state)
        state[node] = 2

    state: dict[str, int] = {}
    for start in sorted(graph):
        if start not in state:
            walk(start, [start], state)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_no_module_imports_a_higher_floor():
    """`lightbert/__init__.py` hands the public verbs on by name (importlib): it is above every floor."""
    graph = import_graph()
    rooms = {module.split(".")[1] for module in graph if module != "lightbert"}
    assert rooms == {room for floor in FLOORS for room in floor}, "a room of the package is on no floor"
    upward = [
        f"{module} (floor {floor_of(module)}) imports {imported} (floor {floor_of(imported)})"
        for module, imported_modules in sorted(graph.items())
        if module != "lightbert"
        for imported in sorted(imported_modules)
        if imported != "lightbert" and floor_of(imported) < floor_of(module)
    ]
    assert not upward, "\n".join(upward)


# The settings builder: config_checks.py checks the config as a whole, settings.py types it.
SETTINGS_BUILDER = ("config_checks.py", "settings.py")


def test_below_the_settings_builder_no_stage_reads_the_config_by_its_keys():
    pattern = re.compile(r"cfg\.get\(|cfg\.trainer\.|OmegaConf\.select\(cfg")
    readers = [
        f"{path.name}:{number}"
        for path in sorted((PACKAGE / "run").glob("*.py"))
        if path.name not in SETTINGS_BUILDER
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if pattern.search(line)
    ]
    assert not readers, readers
    for verb in ("train.py", "evaluate.py"):  # one function each, read top to bottom
        assert len((PACKAGE / "run" / verb).read_text().splitlines()) < 250


def config_node_fields() -> set[str]:
    """The fields of the run's settings that hold a raw config node (annotated `DictConfig`), read from settings.py."""
    tree = ast.parse((PACKAGE / "run" / "settings.py").read_text())
    return {
        node.target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and "DictConfig" in ast.unparse(node.annotation)
    }


def settings_chain(node: ast.expr, aliases: set[str]) -> bool:
    """Whether `node` is reached from the run's settings: `settings.<...>`, or a local name bound to a part of them."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name) and (node.id == "settings" or node.id in aliases)


def test_below_the_builder_a_config_node_is_only_handed_on():
    """Every access to a settings field that holds a raw config node (task.datamodule, task.module, the corpus, the
    callbacks, the config as recorded), in every stage of run/: handed on whole (to the builder, to the record),
    never read by key, item, attribute, method or `in`. settings.py types what the stages read; building.py hands the
    nodes to `hydra.utils.instantiate`."""
    fields = config_node_fields()
    assert {"datamodule", "module", "corpus", "callbacks", "config"} <= fields, fields
    reads = []
    for path in sorted((PACKAGE / "run").glob("*.py")):
        if path.name in ("settings.py", "building.py"):
            continue
        tree = ast.parse(path.read_text())
        aliases = {  # task = settings.task, trainer = settings.trainer, ...
            target.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign) and settings_chain(node.value, set())
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        nodes = {
            id(node)
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr in fields and settings_chain(node.value, aliases)
        }
        for node in ast.walk(tree):
            opened = (  # node.x, node.get(...), node[...]
                node.value
                if isinstance(node, ast.Attribute | ast.Subscript)
                else node.comparators[0]  # "key" in node
                if isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.In | ast.NotIn)
                else None
            )
            if opened is not None and id(opened) in nodes:
                reads.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    assert not reads, "\n".join(reads)


def code_words(path: Path) -> list[tuple[int, str]]:
    """The names and strings of `path`'s code, without its docstrings (which may name a family as an example)."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    words = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            words.append((node.lineno, node.value))
        elif isinstance(node, ast.Name | ast.Attribute):
            words.append((node.lineno, node.id if isinstance(node, ast.Name) else node.attr))
    return words


def test_the_task_families_stay_in_their_folders():
    """A family is its folder and its YAML: run/, inference/, checkpoints/, plugins/, cli/ and the registry name none
    of them."""
    assert {"glue", "ner", "squad", "swag"} <= set(FAMILIES)
    mention = re.compile(r"\b(" + "|".join(FAMILIES) + r")\b|squad_|conll", re.IGNORECASE)
    found = [
        f"{path.relative_to(PACKAGE)}:{number}: {text}"
        for folder in ("run", "inference", "checkpoints", "plugins", "cli", "cluster")
        for path in sorted((PACKAGE / folder).glob("*.py"))
        for number, text in code_words(path)
        if mention.search(text)
    ]
    heads = (PACKAGE / "tasks" / "heads.py").read_text()
    found += [f"heads.py mentions {family}" for family in FAMILIES if f"tasks.{family}" in heads]
    assert not found, "\n".join(found)


def layout_names(block: str) -> list[tuple[str, list[Path]]]:
    """Each module file that the layout block of docs/development.md names, with the folders it may stand in: a row
    names a room of the package (`run/`, a file such as `optim.py`) in its first column, a row indented further a
    folder inside the last room (`pretraining/` under `tasks/`), and its description goes on in the lines under it. A
    bare name (`building.py`) stands in the row's folders; one with a folder (`glue/tasks.py`, `run/config_checks.py`)
    under the row's folders, their parent or the package."""
    named, folders, parent = [], None, PACKAGE
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip())
        if indent in (0, 2, 4) and line.strip():
            head = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
            rooms = head.split()
            if indent == 0:  # src/train.py, ... and src/lightbert/ name src/; conf/, tests/ and the like no module
                folders = [REPO / "src"] if head.startswith("src/train.py") else None
            elif all(room.endswith("/") for room in rooms):
                base = PACKAGE if indent == 2 else parent
                folders = [base / room for room in rooms]
                if indent == 2:
                    parent = folders[0]
            else:  # files at the package's root: optim.py, __init__.py, ...
                folders, parent = [PACKAGE], PACKAGE
        if folders is None:
            continue
        for name in re.findall(r"(?<![\w./-])((?:\w+/)*\w+\.py)\b", line):
            if "/" in name:
                bases = [*folders, *(folder.parent for folder in folders), PACKAGE, REPO]
                named.append((name, [base / name for base in bases]))
            else:
                named.append((name, [folder / name for folder in folders]))
    return named


def test_every_module_the_layout_in_the_docs_names_exists():
    """docs/development.md's layout names each room's modules: one renamed, moved or removed without the page is
    found here, not by a newcomer looking for it."""
    text = (REPO / "docs" / "development.md").read_text()
    block = text.split("\n## Layout\n", 1)[1].split("```")[1]
    named = layout_names(block)
    assert len(named) > 80, named  # the whole block was read, not a part of it
    found = {path.relative_to(REPO).as_posix() for _, paths in named for path in paths if path.is_file()}
    assert {"src/train.py", "src/lightbert/optim.py", "src/lightbert/tasks/pretraining/cache.py"} <= found, found
    missing = [name for name, paths in named if not any(path.is_file() for path in paths)]
    assert not missing, f"docs/development.md's layout names modules that do not exist: {missing}"
