"""The package's shape: layers without cycles, no private names across modules, modules of one size.

Layers, bottom to top (README, "Layout"); a module imports only from its own layer or below:

    leaves        runtime, paths, reference, validation, inputs, tolerances, provenance, recorder, tiling, precision,
                  turns, ranks
    perf          perf.*: remembered launches, the tile table and autotuning choices, descriptor scratch
    chapters      ch01 … ch06 and ch07_hopper: kernels and their launchers (a chapter builds on earlier ones)
    api           attention: the front door (flash_attention, scaled_dot_product_attention), which picks a kernel;
                  tuning: autotuning as an explicit step (tune, the tile table's build)
    parallel      ch10_context_parallel: one sequence across several GPUs, built on the front door's calls
    uses          instruments.* (timelines, byte models, sweeps), integrations.* (Hugging Face, GPT, prefill)
                  and labs.* (the learner's labs and their grader)
    bench         bench.*: the benchmark harness
    figures       figures.*: every figure the site and notebooks draw
    top           the package's __init__ (its public API) and testing (the test harness)
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent
LAYERS = ["leaves", "perf", "chapters", "api", "parallel", "uses", "bench", "figures", "top"]
LEAVES = {"runtime", "paths", "reference", "validation", "inputs", "tolerances", "provenance", "recorder", "tiling",
          "precision", "turns", "ranks"}
MAX_LINES = 700  # a chapter module may be longer when its kernel is


def _modules() -> dict[str, Path]:
    """Dotted name (without the package prefix) → file, for every module of the package but its tests."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "tests" or rel.name == "conftest.py":
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def layer(module: str) -> str:
    top = module.split(".")[0]
    if module in ("", "testing"):
        return "top"
    if module in LEAVES:
        return "leaves"
    if top in ("perf", "bench", "figures"):
        return top
    if module in ("attention", "dispatch", "tuning"):
        return "api"
    if top in ("instruments", "integrations", "labs"):
        return "uses"
    if top.startswith("ch0"):
        return "chapters"
    if module == "ch10_context_parallel":
        return "parallel"
    raise AssertionError(f"tutorial_kernels.{module} belongs to no layer: add it to test_architecture.py")


def _resolve(name: str) -> str | None:
    """A dotted import target inside the package → the module it names (or None if outside)."""
    if name != "tutorial_kernels" and not name.startswith("tutorial_kernels."):
        return None
    return name.removeprefix("tutorial_kernels").removeprefix(".")


def _package_of(module: str, is_package: bool) -> str:
    """The package a module's relative imports start from, as a dotted name."""
    full = f"tutorial_kernels.{module}".rstrip(".")
    return full if is_package else full.rsplit(".", 1)[0]


def analyse(source: str, module: str, is_package: bool = False) -> tuple[list, list]:
    """(imports, private uses) of one module's source, at any depth of the file (imports inside
    functions count: they are cycles all the same).

    imports: (imported module, imported name or None, line) for every import of the package's own
    modules: absolute, relative, or by `importlib.import_module("tutorial_kernels.…")`/`__import__`.
    private uses: (line, "module._name") for every private name of ANOTHER module that is imported or
    reached through an attribute (`m._x` after `import … as m`, `tutorial_kernels.m._x`)."""
    tree = ast.parse(source)
    found, private = [], []
    aliases: dict[str, str] = {}  # local name → the package module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if (target := _resolve(a.name)) is not None:
                    found.append((target, None, node.lineno))
                    aliases[a.asname or a.name.split(".")[0]] = target if a.asname else ""
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = importlib.util.resolve_name("." * node.level + base, _package_of(module, is_package))
            if (target := _resolve(base)) is None:
                continue
            for a in node.names:
                submodule = f"{target}.{a.name}".strip(".")
                if submodule in MODULES:  # `from tutorial_kernels import ch05_flash_v2`
                    found.append((submodule, None, node.lineno))
                    aliases[a.asname or a.name] = submodule
                else:
                    found.append((target, a.name, node.lineno))
                    if a.name.startswith("_") and target != module:
                        private.append((node.lineno, f"{target}.{a.name}"))
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__")))):
            if (target := _resolve(node.args[0].value)) is not None:
                found.append((target, None, node.lineno))
    for node in ast.walk(tree):  # attribute chains rooted at a name bound to a package module
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
            continue
        chain, base = [], node.value
        while isinstance(base, ast.Attribute):
            chain.append(base.attr)
            base = base.value
        if not isinstance(base, ast.Name) or base.id not in aliases:
            continue
        owner = ".".join(filter(None, [aliases[base.id], *reversed(chain)]))
        if owner in MODULES and owner != module:
            private.append((node.lineno, f"{owner}.{node.attr}"))
    return found, private


def _analysed(module: str) -> tuple[list, list]:
    path = MODULES[module]
    return analyse(path.read_text(encoding="utf-8"), module, path.name == "__init__.py")


def imports(module: str) -> list[tuple[str, str | None, int]]:
    return _analysed(module)[0]


def test_every_module_has_a_layer():
    for module in MODULES:
        layer(module)


@pytest.mark.parametrize("module", sorted(MODULES), ids=lambda m: m or "__init__")
def test_imports_go_down_the_layers_and_name_nothing_private(module):
    mine = LAYERS.index(layer(module))
    found, private = _analysed(module)
    for target, _, line in found:
        where = f"tutorial_kernels.{module or '__init__'}:{line}"
        assert LAYERS.index(layer(target)) <= mine, (
            f"{where} imports tutorial_kernels.{target} ({layer(target)}) from the lower layer {layer(module)}")
        if target.startswith("ch0") and module.startswith("ch0"):
            assert target[:4] <= module[:4], f"{where}: chapter {module} imports the later chapter {target}"
    private = [(line, name) for line, name in private if not _lab_of_its_chapter(module, name)]
    assert not private, f"tutorial_kernels.{module or '__init__'} uses private names of other modules: " + ", ".join(
        f"line {line}: {name}" for line, name in private)


def _lab_of_its_chapter(module: str, name: str) -> bool:
    """A chapter's lab (labs.chNN) may name that chapter's private kernels and helpers: its solutions
    are the chapter's own lines, which the lab provides or grades against."""
    return module.startswith("labs.ch") and name.startswith(f"ch{module.removeprefix('labs.ch')[:2]}_")


def test_the_checks_catch_planted_violations():
    """Each way of reaching past a layer or a private name is seen (sources planted, not files)."""
    planted = {
        "from .ch05_flash_v2 import _prepare": ("ch05_flash_v2", "ch05_flash_v2._prepare"),
        "from tutorial_kernels.perf.descriptors import _scratch": ("perf.descriptors", "perf.descriptors._scratch"),
        "import tutorial_kernels.ch05_flash_v2\nx = tutorial_kernels.ch05_flash_v2._prepare":
            ("ch05_flash_v2", "ch05_flash_v2._prepare"),
        "from tutorial_kernels import ch05_flash_v2 as c\nx = c._prepare": ("ch05_flash_v2", "ch05_flash_v2._prepare"),
        "import importlib\nimportlib.import_module('tutorial_kernels.figures')": ("figures", None),
    }
    for source, (target, private_name) in planted.items():
        found, private = analyse(source, "tiling")
        assert target in {t for t, _, _ in found}, source
        assert private_name is None or private_name in {name for _, name in private}, source
    assert LAYERS.index(layer("ch05_flash_v2")) > LAYERS.index(layer("tiling"))  # so the first is an upward import
    assert analyse("from tutorial_kernels.tiling import _x", "tiling")[1] == []  # a module's own privates
    assert _lab_of_its_chapter("labs.ch04", "ch04_flash_v1._finite_or_zero")
    assert not _lab_of_its_chapter("labs.ch04", "ch05_flash_v2._prepare")  # another chapter's: refused
    assert not _lab_of_its_chapter("ch04_flash_v1", "ch04_flash_v1._x")


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A path a → … → a in `graph` (module → the modules it imports), or None when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if state.get(target) is None and (cycle := visit(target)):
                return cycle
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def test_no_import_cycle():
    # a submodule importing its own package counts: the package's __init__ imports its submodules
    graph = {module: {target for target, _, _ in imports(module) if target != module} for module in MODULES}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " → ".join(f"tutorial_kernels.{m}".rstrip(".") for m in cycle)


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


@pytest.mark.parametrize("module", sorted(MODULES), ids=lambda m: m or "__init__")
def test_modules_stay_small(module):
    lines = len(MODULES[module].read_text(encoding="utf-8").splitlines())
    if layer(module) == "chapters":
        return  # a chapter is as long as its kernel and its launcher
    assert lines <= MAX_LINES, f"tutorial_kernels.{module} has {lines} lines (> {MAX_LINES}): split it by concept"


def test_chapters_declare_their_public_api_and_hold_only_their_lesson():
    """A chapter has an `__all__` of names it defines, and no command line, data files or provenance:
    recording and measuring belong to instruments/ and bench/."""
    for module, path in MODULES.items():
        if layer(module) != "chapters":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        defined, exported = set(), None
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    names = t.elts if isinstance(t, ast.Tuple) else [t]  # `A, B = 1, 2` defines both
                    defined.update(n.id for n in names if isinstance(n, ast.Name))
                    if isinstance(t, ast.Name) and t.id == "__all__":
                        exported = ast.literal_eval(node.value)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                defined.update((a.asname or a.name).split(".")[0] for a in node.names)
        assert exported, f"tutorial_kernels.{module} assigns no __all__"
        missing = set(exported) - defined
        assert not missing, f"tutorial_kernels.{module}.__all__ names what it does not define: {sorted(missing)}"
        assert "main" not in defined, f"tutorial_kernels.{module} defines main(): commands live in instruments/ or bench/"
        for target, _, line in imports(module):
            assert target not in ("paths", "provenance"), (
                f"tutorial_kernels.{module}:{line} imports {target}: writing data files belongs to instruments/ or bench/")
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert "argparse" not in imported, f"tutorial_kernels.{module} parses a command line"


def test_no_package_module_cites_the_run_diary_or_experiments():
    """Why the code is as it is points at the site's page of record (docs/how-the-numbers-were-obtained.md),
    which cites the runs; the package itself names no experiment folder and not the diary, which live
    outside the product. (figures/runs.py, which maps a data file's recorded command to where its script
    now lives, is the one module that reads experiments/.)"""
    cited = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "tests" or rel.as_posix() == "figures/runs.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if "experiments/" in line or "BENCHMARKS.md" in line:
                cited.append(f"{rel}:{number}: {line.strip()}")
    assert not cited, "\n".join(cited)
