"""The layout's rules, read from the code itself (every import of the package code, also those inside functions):
- the packages form the layers docs/ARCHITECTURE.md draws: a package imports only packages below its own line;
- no two files import each other, directly or through others (no file circle);
- an import inside a function defers something heavy (torch, diffusers, transformers, gradio, ray, av, ...) for a
  module that does not load it already, or a module of one platform only; never a light module, and never a loop;
- only the modules docs/ARCHITECTURE.md lists under "The environment" touch the process's environment, each naming
  only the variables listed for it;
- no test module imports another test module (also not in the code a test runs in a child process).
"""
from __future__ import annotations

import ast
import fnmatch
import re
import sys
from functools import lru_cache
from pathlib import Path

from tests.conftest import ROOT

PACKAGES = ("app", "cli", "common", "configs", "farm", "jobfolder", "jobs", "memory", "pipeline", "post", "rocm", "ui",
            "video")
HEAVY = {"torch", "diffusers", "transformers", "accelerate", "gradio", "gradio_client", "ray", "av", "safetensors",
         "huggingface_hub", "playwright", "psutil", "tqdm", "PIL", "numpy", "einops", "httpx",
         "cudnn",                       # cudnn: the optional cuDNN frontend (rocm/fp8_attention.py)
         "flash_attn",                  # flash_attn: the optional FlashAttention-4 (rocm/sdpa.py), CuTe DSL
         "flash_attn_interface",        # the optional FlashAttention-3 (rocm/fp8_attention.py), its CUDA extension
         "triton"}                      # Triton (pipeline/fp8_rows_kernel.py), where PyTorch's wheel brings it
ONE_PLATFORM = {"resource", "fcntl", "msvcrt", "winreg", "termios", "ctypes"}


def _files() -> dict[str, Path]:
    files = {"app": ROOT / "app.py"}
    for package in PACKAGES[1:]:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            files[".".join(parts)] = path
    return files


FILES = _files()


def _resolve(name: str) -> str | None:
    while name:
        if name in FILES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(module: str) -> list[tuple[str, bool, int]]:
    """(imported name, inside a function?, line) for every import of the module; `from a import b` gives a.b and
    a."""
    tree = ast.parse(FILES[module].read_text("utf-8"))
    package = module if FILES[module].name == "__init__.py" else module.rpartition(".")[0]
    found = []

    def visit(node, inside):
        for child in ast.iter_child_nodes(node):
            nested = inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((a.name, nested, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(up + ([base] if base else []))
                found.extend([(f"{base}.{a.name}", nested, child.lineno) for a in child.names]
                             + [(base, nested, child.lineno)])
            visit(child, nested)

    visit(tree, False)
    return found


@lru_cache(maxsize=None)
def _edges(module: str) -> tuple[tuple[str, bool], ...]:
    """Internal modules the module imports: (module, inside a function?), each once (a top-level import wins)."""
    out: dict[str, bool] = {}
    for name, inside, _ in _imports(module):
        target = _resolve(name) if name.split(".")[0] in PACKAGES else None
        # a package's own __init__ seen from inside the package is not an edge (Python runs it first anyway)
        if target and target != module and not (FILES[target].name == "__init__.py"
                                                and module.startswith(target + ".")):
            out[target] = out.get(target, True) and inside
    return tuple(out.items())


@lru_cache(maxsize=None)
def _loads_at_import(module: str) -> frozenset[str]:
    """The heavy libraries importing the module loads: its top-level imports and its packages' __init__ files,
    followed through the package code."""
    heavy, seen, todo = set(), set(), [module]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        heavy |= {n.split(".")[0] for n, inside, _ in _imports(m) if not inside and n.split(".")[0] in HEAVY}
        todo += [t for t, inside in _edges(m) if not inside]
        todo += [p for p in (m.rsplit(".", k)[0] for k in range(1, m.count(".") + 1)) if p in FILES]
    return frozenset(heavy)


def _layers() -> list[set[str]]:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text("utf-8")
    block = text.split("## The packages", 1)[1].split("```")[1]
    layers = []
    for line in block.splitlines():
        names = re.match(r"^((?:[a-z_]+(?:/|\.py) )+)", line + " ")
        if names:
            layers.append({n.rstrip("/").removesuffix(".py") for n in names.group(1).split()})
    return layers


def test_the_packages_import_only_the_layers_below_them():
    layers = _layers()
    assert set().union(*layers) == set(PACKAGES), "docs/ARCHITECTURE.md draws every package once"
    level = {p: i for i, layer in enumerate(layers) for p in layer}
    wrong = sorted({f"{m} imports {t}" for m in FILES for t, _ in _edges(m)
                    if m.split(".")[0] != t.split(".")[0] and level[t.split(".")[0]] <= level[m.split(".")[0]]})
    assert not wrong, wrong


def test_no_file_circle():
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []
    sys.setrecursionlimit(10000)

    def connect(v):                                       # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w, _ in _edges(v):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for module in FILES:
        if module not in index:
            connect(module)
    assert not circles, circles


def _defers(module: str, name: str, already: frozenset[str]) -> set[str]:
    """What importing `name` inside a function of `module` defers: heavy libraries the module does not load yet (or
    a module of one platform)."""
    top = name.split(".")[0]
    if top in PACKAGES:
        target = _resolve(name)
        if target is None or target == module:
            return set()
        return set(_loads_at_import(target) - already)
    return {top} - already if top in HEAVY else {top} & ONE_PLATFORM


def test_an_import_inside_a_function_defers_something_heavy():
    wrong = []
    for module in FILES:
        already = _loads_at_import(module)
        statements: dict[int, list[str]] = {}
        for name, inside, line in _imports(module):
            if inside and name:
                statements.setdefault(line, []).append(name)
        wrong += [f"{module}: {names[-1]}" for names in statements.values()
                  if not any(_defers(module, n, already) for n in names)]
    assert not wrong, f"{len(wrong)} imports inside functions defer nothing heavy: {sorted(set(wrong))}"


def _environment_rules() -> dict[str, set[str]]:
    """docs/ARCHITECTURE.md's block under "The environment": module or package (a dotted prefix) -> the variables
    it may name (patterns; "*": any, also the environment as a whole)."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text("utf-8")
    block = text.split("## The environment", 1)[1].split("```")[1]
    rules = {}
    for line in block.strip().splitlines():
        where, *names = line.split()
        rules[where.removesuffix(".py").rstrip("/").replace("/", ".")] = set(names)
    return rules


ENV_NAMES = {"environ", "getenv", "putenv", "unsetenv"}


def _environment_use(module: str) -> tuple[bool, set[str], bool]:
    """(does the module touch os.environ?, the variables it names there, does it use it as a whole or by a name that
    is not a constant?)."""
    tree = ast.parse(FILES[module].read_text("utf-8"))
    constants = {t.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
                 and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
                 for t in node.targets if isinstance(t, ast.Name)}
    touches, names, opaque = False, set(), False

    def is_env(node) -> bool:
        return "environ" in ast.unparse(node) or "getenv" in ast.unparse(node)

    def key(node) -> None:
        nonlocal opaque
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)
        elif isinstance(node, ast.Name) and node.id in constants:
            names.add(constants[node.id])
        else:
            opaque = True

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ENV_NAMES and ast.unparse(node.value) == "os":
            touches = True
        elif isinstance(node, ast.ImportFrom) and node.module == "os" and {a.name for a in node.names} & ENV_NAMES:
            touches = True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            if node.func.attr in ("get", "setdefault", "pop") and is_env(node.func.value):
                key(node.args[0])
            elif node.func.attr in ("getenv", "putenv", "unsetenv"):
                key(node.args[0])
        elif isinstance(node, ast.Subscript) and is_env(node.value):
            key(node.slice)
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("dict", "list") and node.args \
                and is_env(node.args[0]):
            opaque = True
    return touches, names, opaque


def test_only_the_listed_modules_touch_the_environment_and_only_their_variables():
    rules = _environment_rules()
    wrong, listed = [], set()
    for module in FILES:
        touches, names, opaque = _environment_use(module)
        if not touches:
            continue
        rule = next((r for r in sorted(rules, key=len, reverse=True) if module == r or module.startswith(r + ".")),
                    None)
        if rule is None:
            wrong.append(f"{module} touches the environment (not listed)")
            continue
        listed.add(rule)
        allowed = rules[rule]
        if "*" in allowed:
            continue
        if opaque:
            wrong.append(f"{module} uses the environment whole or by a computed name")
        wrong += [f"{module} names {n}" for n in sorted(names)
                  if not any(fnmatch.fnmatchcase(n, pattern) for pattern in allowed)]
    assert not wrong, wrong
    assert listed == set(rules), f"listed but touching nothing: {sorted(set(rules) - listed)}"


def test_the_rules_catch_what_they_are_for(tmp_path, monkeypatch):
    """The checks above fail on a circle, an upward import and a needless import inside a function."""
    fake = {"app": tmp_path / "app.py", "common.a": tmp_path / "a.py", "common.b": tmp_path / "b.py",
            "configs.c": tmp_path / "c.py"}
    fake["app"].write_text("")
    fake["common.a"].write_text("from common.b import x\n")
    fake["common.b"].write_text("def f():\n    from common.a import y\n")
    fake["configs.c"].write_text("def g():\n    import json\n")
    monkeypatch.setitem(globals(), "FILES", fake)
    _edges.cache_clear()
    _loads_at_import.cache_clear()
    try:
        assert dict(_edges("common.b")) == {"common.a": True}
        try:
            test_no_file_circle()
        except AssertionError as e:
            assert "common.a" in str(e)
        else:
            raise AssertionError("a circle went unseen")
        fake["common.a"].write_text("from configs.c import g\n")
        _edges.cache_clear()
        _loads_at_import.cache_clear()
        try:
            test_the_packages_import_only_the_layers_below_them()
        except AssertionError as e:
            assert "common.a imports configs.c" in str(e)
        else:
            raise AssertionError("an import of a layer above went unseen")
        try:
            test_an_import_inside_a_function_defers_something_heavy()
        except AssertionError as e:
            assert "common.b: common.a" in str(e) and "configs.c: json" in str(e)
        else:
            raise AssertionError("a needless import inside a function went unseen")
    finally:
        _edges.cache_clear()
        _loads_at_import.cache_clear()


def test_the_environment_rule_catches_an_unlisted_read_and_an_unlisted_variable(tmp_path, monkeypatch):
    fake = {"configs.c": tmp_path / "c.py", "farm.dispatch": tmp_path / "d.py", "pipeline.compiled": tmp_path / "p.py",
            "ui.settings": tmp_path / "u.py", "common.environment": tmp_path / "e.py", "rocm.env": tmp_path / "r.py"}
    for path in fake.values():
        path.write_text("import os\nos.environ\n")
    fake["configs.c"].write_text("import os\nHOME = os.environ.get('HOME')\n")
    fake["farm.dispatch"].write_text("import os\nVAR = 'RAY_ADDRESS'\nos.environ[VAR] = 'x'\n")
    monkeypatch.setitem(globals(), "FILES", fake)
    try:
        test_only_the_listed_modules_touch_the_environment_and_only_their_variables()
    except AssertionError as e:
        assert "configs.c touches the environment" in str(e) and "farm.dispatch names RAY_ADDRESS" in str(e)
    else:
        raise AssertionError("an unlisted environment read went unseen")


# What tests share (helpers, constants, fixtures) lives in tests/conftest.py and tests/*_helpers.py, never in a test
# module another one imports: a test module is one file of tests, and what it defines is its own. Read as text, so
# the code a test hands a child process (`python -c`) counts too.
TEST_MODULE_IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+tests\.test_\w*|import[ \t]+tests\.test_\w*"
                                r"|from[ \t]+tests[ \t]+import[ \t(]+(?:[\w \t,]*,[ \t]*)?test_\w*)", re.M)


def _test_module_imports(folder: Path) -> list[str]:
    """Every import of a test module (tests.test_*) in the Python files under `folder`: "file:line: statement"."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        text = path.read_text("utf-8")
        found += [f"{path.relative_to(folder)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0).strip()}"
                  for m in TEST_MODULE_IMPORT.finditer(text)]
    return found


def test_no_test_module_imports_another():
    wrong = _test_module_imports(ROOT / "tests")
    assert not wrong, f"test modules imported (move what they share into tests/*_helpers.py): {wrong}"


def test_the_test_module_rule_catches_every_form(tmp_path):
    (tmp_path / "test_a.py").write_text("from tests.test_extend import run\n\ndef f():\n    import tests.test_b\n")
    (tmp_path / "test_c.py").write_text("CHILD = \"\"\"\nimport sys\nfrom tests import fuzz_helpers, test_d\n\"\"\"\n")
    (tmp_path / "test_e.py").write_text("from tests.extend_helpers import run\nfrom tests import fuzz_helpers\n"
                                        "from tests.conftest import make_image  # tests.test_x is not imported\n")
    assert _test_module_imports(tmp_path) == ["test_a.py:1: from tests.test_extend", "test_a.py:4: import tests.test_b",
                                              "test_c.py:3: from tests import fuzz_helpers, test_d"]
