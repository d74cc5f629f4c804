"""The structure the code promises, checked so it cannot erode one import or one flag at a time:
layers with one direction (docs: README "Layout"), no algorithm named outside algorithms/, the loop
naming every role, and the size budgets (a file, a function, an algorithm)."""

import ast
import functools
import subprocess
import sys
from pathlib import Path

import pytest

from rlpost.algorithms import ALGORITHMS

SRC = Path(__file__).resolve().parents[1] / "src" / "rlpost"

# Lowest first. A module may import from its own layer (without cycles) or from lower ones, never
# from a higher one: counting imports made inside functions, which would otherwise hide a cycle.
LAYERS = [
    # the batch, the role contracts, the errors; one line to the user; worker pipes; the one worker pool
    ("types", "console", "wire", "workers"),
    # typed config, loading and checks; other frameworks' names for its keys; what this machine accepts; a run's config
    # files; what loading fills in (defaults that follow the task, reward functions' file paths)
    ("config", "config_rules", "sections", "task_section", "names", "machine", "runconfig", "defaults", "env_config"),
    ("sandbox",),  # runs model-written programs under limits and isolation; of rlpost only wire, no torch
    ("envs",),  # task families, verifier functions, data rows; no torch
    ("algorithms", "search"),  # pure maths: advantages, losses, knobs as wrappers; pass@k, votes
    ("model",),  # loading, log-probs, LoRA, FSDP, checkpoints, encoding rows
    ("roles",),  # rollout engines, reference, critic, trainer
    ("rewards",),  # everything with score(batch): verifier runner, stacks, judge, reward model, PRM
    ("observe",),  # metrics, report, health checks, planner
    ("distributed",),  # Ray actors, the rollout pool
    ("build",),  # the one place roles are assembled from a config
    ("config_check",),  # the whole config checked at once before torch loads, for the CLI and rlpost.Trainer
    ("recipes",),  # entry points: the RL loop, evaluation, offline/online preference, pipeline, PRM, search
    ("cli", "__main__", "__init__"),
]
# Imports of rlpost modules inside a function, each with its reason. Anything else goes at the top.
LAZY_OK = {
    "rlpost.cli": "commands load their recipe after the config is checked (errors before torch loads)",
    "rlpost.build": "distributed/ needs the optional ray extra",
    "rlpost.recipes.api": "rlpost.Trainer checks the whole config before torch loads: the modules that import torch "
                          "load once it passed",
    "rlpost": "the package exports its API lazily (PEP 562): `import rlpost` loads no torch, so config errors come "
              "first",
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int:
    top = (module.split(".") + ["__init__"])[1]
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"{module}: not in any layer of tests/test_style.py (add it)")


MODULES = {module_name(f) for f in SRC.rglob("*.py")}


def rlpost_imports(tree: ast.Module):
    """(imported module, line, inside a function) for every import of rlpost."""
    in_function = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for n in ast.walk(f)}
    type_only = {id(n) for f in ast.walk(tree) if isinstance(f, ast.If) and "TYPE_CHECKING" in ast.unparse(f.test)
                 for n in ast.walk(f)}  # `if TYPE_CHECKING:` imports never run
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "rlpost":
            # `from rlpost.envs import code` imports the module rlpost.envs.code (and runs rlpost.envs);
            # `from rlpost.envs import Task` imports the package's own name
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module
                     for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.split(".")[0] == "rlpost"]
        for name in names:
            yield name, node.lineno, id(node) in in_function


@functools.cache  # parsed once for the five checks that walk every module (read-only trees)
def sources():
    return tuple((module_name(f), f, ast.parse(f.read_text())) for f in sorted(SRC.rglob("*.py")))


def test_imports_only_go_down_the_layers():
    upward, lazy = [], []
    for me, f, tree in sources():
        for target, line, inside in rlpost_imports(tree):
            if layer(target) > layer(me):
                upward.append(f"{f.relative_to(SRC)}:{line} imports {target} (layer {layer(target)} > {layer(me)})")
            if inside and me not in LAZY_OK:
                lazy.append(f"{f.relative_to(SRC)}:{line} imports {target} inside a function")
    assert not upward, upward
    assert not lazy, lazy


def test_no_import_cycles_between_modules():
    graph = {me: {t for t, _, _ in rlpost_imports(tree) if t != me} for me, _, tree in sources()}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in graph.get(node, ()):
            assert state.get(nxt) != 1, " -> ".join(path + [nxt])
            if nxt in graph and nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in graph:
        if node not in state:
            visit(node, [node])


def test_no_algorithm_is_named_outside_algorithms():
    # What differs between algorithms is read from their traits; a comparison with an algorithm's
    # name anywhere else is knowledge that drifts (the planner once charged TIS a pass the loop dropped).
    found = []
    for me, f, tree in sources():
        if me.startswith("rlpost.algorithms"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                consts = [c for c in [node.left, *node.comparators] if isinstance(c, ast.Constant)]
                consts += [e for c in node.comparators if isinstance(c, (ast.Tuple, ast.List, ast.Set)) for e in c.elts]
                if any(isinstance(c, ast.Constant) and c.value in ALGORITHMS for c in consts):
                    found.append(f"{f.relative_to(SRC)}:{node.lineno}")
    assert not found, found


def functions(tree):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def test_the_loop_names_every_role_and_fits_a_screen():
    src = (SRC / "recipes" / "rl.py").read_text()
    fns = {fn.name: fn for fn in functions(ast.parse(src))}
    # The loop is train(); its first stage is the sampling stage's (generate + score, then shaping and DAPO's
    # group filter with refills): recipes/sampling_stage.py, whose rollout.generate and verifier.score count here.
    stage = (SRC / "recipes" / "sampling_stage.py").read_text()
    body = ast.get_source_segment(src, fns["train"]) + stage
    for verb in ("rollout.generate", "verifier.score", "reference.logprobs", "algo.advantages", "trainer.update",
                 "rollout.load_weights", "trainer.recompute", "rollout.sleep"):
        assert verb in body, verb
    # A screen: the 80 lines it had when lines were not yet held to 120 columns, counted as its 68 statements,
    # so that wrapping a line neither helps nor hurts.
    assert statements(fns["train"]) - 1 <= 68


def statements(node: ast.AST) -> int:
    """Statements under `node`, nested ones included, docstrings not: a size that wrapping a line
    does not change, so a budget is never met by writing sideways or by splitting lines."""
    return sum(1 for n in ast.walk(node) if isinstance(n, ast.stmt) and not (
        isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)))


# The loop, recipes/rl.py: train, has its own budget: a screen (test_the_loop_names_every_role_and_fits_a_screen).
FUNCTION_STATEMENTS, ALGORITHM_FILE_STATEMENTS, FILE_STATEMENTS = 50, 160, 320


def test_functions_at_most_50_statements():
    too_long = []
    for name, f, tree in sources():
        for fn in functions(tree):
            n = statements(fn) - 1  # the def itself
            if n > FUNCTION_STATEMENTS and (name, fn.name) != ("rlpost.recipes.rl", "train"):
                too_long.append(f"{f.relative_to(SRC)}:{fn.lineno} {fn.name} ({n} statements)")
    assert not too_long, too_long


def test_algorithm_files_at_most_160_statements_and_components_320():
    for _, f, tree in sources():
        n = statements(tree)
        limit = ALGORITHM_FILE_STATEMENTS if "algorithms" in f.parts else FILE_STATEMENTS
        assert n <= limit, f"{f.relative_to(SRC)} has {n} statements (budget {limit}): split it by role"


def test_statements_count_what_a_reader_reads():
    tree = ast.parse('def f(x):\n    """doc"""\n    y = (x +\n         1)\n    if y:\n        return y\n    return 0\n')
    assert statements(tree.body[0]) - 1 == 4  # y =, if, return y, return 0: the docstring and the wrap count nothing


TESTS = Path(__file__).resolve().parent


def test_test_files_never_import_each_other_nor_install_packages():
    # Shared helpers live in tests/helpers.py (and fixtures in conftest.py); a test module imported by
    # another runs its tests twice and ties two files together. System packages are the set-up's
    # job (scripts/setup.sh), never a test's.
    test_modules = {f.stem for f in TESTS.rglob("test_*.py")}
    found = []
    for f in sorted(TESTS.rglob("*.py")):
        src = f.read_text()
        for node in ast.walk(ast.parse(src)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{f.relative_to(TESTS)}:{node.lineno} imports {n}" for n in names
                      if n.split(".")[-1] in test_modules or n.split(".")[0] in ("tests", "conftest")]
        installs = ['"apt-get", "install"', "'apt-get', 'install'", '"pip", "install"', "'pip', 'install'"]
        if f.name != "test_style.py" and any(s in src for s in installs):
            found.append(f"{f.relative_to(TESTS)} installs a package")
    assert not found, found


# Where a "cpu" string literal may stand under src/, each with its reason (issue 17: no literal
# decides where a tensor or autocast goes; a role reads its device from its model, model/device.py).
# Keys are "file:function" ("<module>" at module level). A new entry needs a reason a reviewer accepts.
CPU_LITERAL_OK = {
    "model/device.py:<module>": "device.CPU: the one name of the host, which everything else refers to",
    "sections.py:RunConfig": "run.device's choices (auto | cpu | cuda): the config key itself",
    "observe/devices.py:probed_cpu": "the planner's hardware catalogue: 'cpu' is a machine to predict for, no tensor "
                                     "moves",
    "observe/devices.py:<module>": "the planner's efficiency table keyed by hardware kind ('cpu' vs 'gpu')",
    "observe/devices.py:table": "the planner's efficiency and overhead tables keyed by hardware kind",
    "observe/devices.py:resolve_device": "`rlpost plan --device cpu|cpu-avx512|<gpu>`: hardware names, not torch "
                                         "devices",
    "observe/planner.py:calibrate": "`rlpost plan calibrate --device cpu`: a hardware name for the planner",
    "observe/plan_inputs.py:parse_eff": "the planner's efficiency phases, read from its 'cpu' table",
    "observe/plan_inputs.py:add_arguments": "`rlpost plan --device` default and help: a hardware name for the planner",
    "cli.py:plan_arguments": "`rlpost plan --device cpu|cpu-avx512` (the default): hardware names for the planner",
    "model/cores.py:sample": "the /proc/stat lines of this process's cores ('cpu0', 'cpu1', ...), not a torch device",
    "sandbox/isolation.py:own_cgroup_dirs": "the cgroup v2 'cpu' controller of the code sandbox, not a torch device",
    "sandbox/isolation.py:cgroup_host": "the cgroup v2 'cpu' controller of the code sandbox, not a torch device",
}


def cpu_literals():
    """("file:function", line) of every "cpu" (or "cpu:N") string constant under src/."""
    for _, f, tree in sources():
        rel = f.relative_to(SRC).as_posix()
        todo = [(tree, "<module>")]  # (node, its innermost enclosing def or class): one pass down the tree
        while todo:
            node, owner = todo.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                owner = node.name
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                    (node.value == "cpu" or node.value.startswith("cpu:")):
                yield f"{rel}:{owner}", node.lineno
            todo.extend((child, owner) for child in ast.iter_child_nodes(node))


def test_no_cpu_literal_decides_a_device():
    # A role's tensors go to its model's device (model/device.py); autocast, the chunked
    # log-softmax and the shared-prefix forward ask the tensors. A "cpu" literal elsewhere would
    # pin something to the host on a GPU run, which no CPU test can see.
    found = [f"{where} (line {line})" for where, line in cpu_literals() if where not in CPU_LITERAL_OK]
    assert not found, f"a 'cpu' literal outside tests/test_style.py CPU_LITERAL_OK: {found}"
    used = {where for where, _ in cpu_literals()}
    assert not set(CPU_LITERAL_OK) - used, f"allow-list entries with no literal left: {set(CPU_LITERAL_OK) - used}"


FACTORIES = {"zeros", "ones", "full", "empty", "tensor", "arange", "rand", "randn"}


def test_the_maths_makes_tensors_where_its_inputs_are():
    # algorithms/ and search/ run wherever the batch is (run.device): a torch.zeros(...) without
    # device= lands on the CPU beside CUDA inputs. *_like and new_* follow their tensor already.
    found = []
    for f in sorted((SRC / "algorithms").glob("*.py")) + sorted((SRC / "search").glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in FACTORIES
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"
                    and not any(k.arg == "device" for k in node.keywords)):
                found.append(f"{f.relative_to(SRC)}:{node.lineno} torch.{node.func.attr}")
    assert not found, f"tensors made without device= (pass the input's .device): {found}"


CONFIG_SECTIONS = {"model", "task", "rollout", "algo", "trainer", "pref", "run", "dist", "offload", "derived"}


def test_config_sections_are_spelled_out():
    # `r = cfg.rollout` makes `r` mean one section here and another thing in the next file; a section
    # keeps its name (rollout, task, ...), and so does a parameter that holds one (`pref: PrefConfig`).
    found = []
    for _, f, tree in sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple):
                pairs = (list(zip(node.targets[0].elts, node.value.elts)) if isinstance(node.targets[0], ast.Tuple)
                         else [])
            elif isinstance(node, ast.Assign):
                pairs = [(target, node.value) for target in node.targets]
            elif isinstance(node, ast.arg) and node.annotation is not None:
                if len(node.arg) == 1 and ast.unparse(node.annotation).endswith("Config"):
                    found.append(f"{f.relative_to(SRC)}:{node.lineno} {node.arg}: {ast.unparse(node.annotation)}")
                continue
            else:
                continue
            for target, value in pairs:
                if (isinstance(target, ast.Name) and len(target.id) == 1 and isinstance(value, ast.Attribute)
                        and value.attr in CONFIG_SECTIONS and "cfg" in ast.unparse(value.value)):
                    found.append(f"{f.relative_to(SRC)}:{node.lineno} {target.id} = {ast.unparse(value)}")
    assert not found, found


ROOT = SRC.parents[1]
LINE_LIMIT = 120  # pyproject.toml [tool.ruff] line-length


def lines_over(text: str, limit: int = LINE_LIMIT) -> list[int]:
    """The numbers of the lines of `text` longer than `limit` characters."""
    return [n for n, line in enumerate(text.splitlines(), 1) if len(line) > limit]


def test_ruff_finds_nothing_in_src():
    # pyproject.toml's [tool.ruff] rules over src/ (unused imports, undefined names, lambdas bound to names, `l`):
    # the test extra installs ruff (scripts/setup.sh), so CI never skips this
    pytest.importorskip("ruff", reason="ruff is not installed: scripts/setup.sh installs the test extra, which has it")
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "src"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_no_line_over_120_columns():
    # benchmarks/ one level deep: benchmarks/.trl holds TRL, installed by the speed benchmark
    files = sorted([*SRC.rglob("*.py"), *TESTS.rglob("*.py"), *(ROOT / "benchmarks").glob("*.py"),
                    *(ROOT / "scripts").glob("*.py")])
    found = [f"{f.relative_to(ROOT).as_posix()}:{n}" for f in files for n in lines_over(f.read_text())]
    assert not found, found


def test_a_line_of_121_columns_is_reported_and_one_of_120_is_not():
    text = "x = 1\n" + "#" * 120 + "\n" + "y = '" + "a" * 115 + "'\n"
    assert [len(line) for line in text.splitlines()] == [5, 120, 121]
    assert lines_over(text) == [3]


# Below build.py a module takes plain values or its own config section (docs/design.md), except
# these, whose subject is a whole config file: the run folder writes config.yaml, the planner (and
# its inputs, split from it) plans from a finished run's.
WHOLE_CONFIG_OK = {"observe/planner.py", "observe/plan_inputs.py", "observe/runfolder.py"}


# Below build.py, the modules that load a whole config (a run folder's, a file's), each with its reason: a config
# file is its subject. Everything else is handed its section or its values by a recipe (rlpost export's
# reading of the run's config is recipes/export.py's, not model/export.py's).
LOADS_CONFIG_OK = {
    "observe/planner.py": "rlpost plan --from RUN: plans from a finished run's config",
    "observe/plan_inputs.py": "rlpost plan --algo/--kl-coef: the flags as an algo section, to read its traits",
    "observe/diagnostics.py": "rlpost doctor: whether a run folder's config still loads is one of its findings",
}
CONFIG_LOADERS = {"runconfig.load_run", "load_run", "config.load", "config.from_dict", "from_dict", "config_check.load"}


def below_build() -> list[tuple[str, ast.AST]]:
    """(path under src/rlpost, tree) of every module in a layer below build.py's."""
    below = {name for names in LAYERS[LAYERS.index(("sandbox",)):LAYERS.index(("build",))] for name in names}
    rels = ((f.relative_to(SRC).as_posix(), tree) for _, f, tree in sources())
    return [(rel, tree) for rel, tree in rels if rel.split("/")[0] in below]


def test_below_build_py_no_module_loads_a_whole_config():
    found, used = [], set()
    for rel, tree in below_build():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in CONFIG_LOADERS:
                (used.add(rel) if rel in LOADS_CONFIG_OK else found.append(f"{rel}:{node.lineno}"))
    assert not found, f"a recipe loads the config and hands this module its section: {found}"
    assert used == set(LOADS_CONFIG_OK), f"entries that load no config any more: {set(LOADS_CONFIG_OK) - used}"


def test_below_build_py_no_function_takes_the_whole_config():
    found, used = [], set()
    for rel, tree in below_build():
        for node in ast.walk(tree):
            if isinstance(node, ast.arg) and (node.arg == "cfg" or node.annotation is not None
                                              and ast.unparse(node.annotation) in ("Config", "config.Config")):
                (used.add(rel) if rel in WHOLE_CONFIG_OK else found.append(f"{rel}:{node.lineno} {node.arg}"))
    assert not found, f"pass the section or the values instead: {found}"
    assert used == WHOLE_CONFIG_OK, f"WHOLE_CONFIG_OK entries with no whole config left: {WHOLE_CONFIG_OK - used}"


# The engine room (roles/, model/) is where the speed lives; a function there that takes more than
# six things is one whose callers must thread flags through it (issue 55: policy_forward took 9, the
# trainer's micro-batch step 8). What belongs together goes in one object (a Scoring, a Sizes, a
# plan). self, cls and an autograd Function's ctx are not counted.
MAX_PARAMETERS = 6


def parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    a = fn.args
    names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    names += [f"*{a.vararg.arg}"] if a.vararg else []
    names += [f"**{a.kwarg.arg}"] if a.kwarg else []
    return [n for n in names if n not in ("self", "cls", "ctx")]


def test_no_function_in_roles_or_model_takes_more_than_six_parameters():
    over = []
    for folder in ("roles", "model"):
        for path in sorted((SRC / folder).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                        and len(parameters(node)) > MAX_PARAMETERS):
                    over.append(f"{folder}/{path.name}:{node.lineno} {node.name}({', '.join(parameters(node))})")
    assert not over, over


def test_parameters_count_what_a_caller_passes():
    seven = ast.parse("def f(self, a, b, /, c, *d, e, f=1, **g): pass").body[0]
    assert parameters(seven) == ["a", "b", "c", "e", "f", "*d", "**g"]  # 7: over the limit, self aside
    six = ast.parse("def forward(ctx, h, w, y, spec, floor=None, head_grad=None): pass").body[0]
    assert len(parameters(six)) == MAX_PARAMETERS


PRIVATE_CALLS_BUDGET = 10


def private_calls(text: str) -> list[int]:
    """Lines calling a private function or method of an object (``x._name(...)``), standard modules' and
    torch's own aside: where a test reaches past a module's public face."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            attr, base = node.func.attr, ast.unparse(node.func.value)
            if attr.startswith("_") and not attr.startswith("__") and base.split(".")[0] not in (
                    "os", "sys", "self", "cls", "torch"):
                found.append(node.lineno)
    return found


def test_tests_call_private_code_rarely_and_say_why():
    # Tests pin what a module promises, so its insides can change: at most PRIVATE_CALLS_BUDGET calls of a
    # private function from tests/ (hostile programs aside: they attack the interpreter), each with
    # "# private: why" on its line
    calls = []
    for f in sorted(TESTS.rglob("*.py")):
        if "hostile" in f.parts:
            continue
        lines = f.read_text().splitlines()
        calls += [(f.relative_to(ROOT).as_posix(), n, "# private:" in lines[n - 1])
                  for n in private_calls(f.read_text())]
    assert len(calls) <= PRIVATE_CALLS_BUDGET, calls
    assert all(why for *_, why in calls), [c for c in calls if not c[2]]


def test_a_private_call_is_found_and_a_public_or_torch_one_is_not():
    text = "m._f(1)\nm.f(1)\ntorch._C._x()\nos._exit(0)\nself._g()\na.b._h()\n"
    assert private_calls(text) == [1, 6]
