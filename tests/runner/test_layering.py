"""Layering of the packages (issue 17), read from the source with ``ast`` (every import statement,
also the ones inside functions, which a plain ``import`` of the module would never reveal):

- no import cycles among nsa_core / nsa_runner / stages modules (a module never imports, directly
  or through others, a module that imports it back);
- dependencies point one way, stages -> nsa_runner -> nsa_core: nothing under nsa_runner imports
  the stages (``stages`` / ``nsa_run_stages``, also through ``importlib.import_module("...")``),
  nsa_core imports neither;
- one spelling of the branch names: ``BRANCHES`` is defined once (nsa_core/config.py) and no other
  literal lists the three branches with another spelling, except the documented read-counter keys
  of the cache (``READ_KEYS``: "sel", a public contract of docs/semantics.md §4).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("nsa_core", "nsa_runner", "stages")
STAGE_NAMES = ("stages", "nsa_run_stages")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in sorted((REPO / pkg).rglob("*.py")):
            parts = list(p.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = p
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[str, int]]:
    """(absolute dotted target, line) of every import in the file, relative ones resolved; a
    ``from X import y`` names X.y when that is a module, else X; string arguments of
    importlib.import_module count too."""
    tree = ast.parse(path.read_text(), filename=str(path))
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")
                up = up[:len(up) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            for a in node.names:
                full = f"{base}.{a.name}"
                out.append((full if full in MODULES else base, node.lineno))
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            out.append((node.args[0].value, node.lineno))
    return out


def _graph() -> dict[str, set[str]]:
    g = {}
    for name, path in MODULES.items():
        g[name] = {t for t, _ in _imports(name, path) if t in MODULES and t != name}
    return g


def _cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_the_scan_sees_function_level_imports():
    """Guard of the guard: imports inside functions are in the graph (decode-bench imports the
    timer inside measure())."""
    assert "nsa_runner.measure.timing" in _graph()["stages.decode_bench"]
    assert len(MODULES) > 40 and "nsa_core.decode.static" in MODULES


def test_cycle_finder_finds_a_planted_cycle():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(g) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles (also through function-level imports): " + "; ".join(
        " <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("pkg, banned", [("nsa_runner", STAGE_NAMES), ("nsa_core", STAGE_NAMES + ("nsa_runner",))])
def test_dependencies_point_one_way(pkg, banned):
    bad = [f"{MODULES[m].relative_to(REPO)}:{line} imports {t}" for m in MODULES if m.split(".")[0] == pkg
           for t, line in _imports(m, MODULES[m]) if t.split(".")[0] in banned]
    assert not bad, bad


BRANCH_SPELLINGS = {"cmp", "slc", "sel", "win"}


def test_one_spelling_of_the_branch_names():
    from nsa_core.config import BRANCHES

    defs, odd = [], []
    for m, path in MODULES.items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = {t.id for t in targets if isinstance(t, ast.Name)}
                if "BRANCHES" in names:
                    defs.append(m)
                if "READ_KEYS" in names and m == "nsa_core.decode.cache":
                    continue  # the documented counter keys (semantics §4)
            if isinstance(node, ast.Tuple | ast.List) and len(node.elts) == 3 and all(
                    isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
                vals = tuple(e.value for e in node.elts)
                if set(vals) <= BRANCH_SPELLINGS and vals != tuple(BRANCHES) and not _is_read_keys(tree, node):
                    odd.append(f"{path.relative_to(REPO)}:{node.lineno} {vals}")
    assert defs == ["nsa_core.config"], f"BRANCHES defined in {defs}"
    assert not odd, f"branch names spelled differently from nsa_core.config.BRANCHES {BRANCHES}: {odd}"


def _is_read_keys(tree, node) -> bool:
    for a in ast.walk(tree):
        if isinstance(a, ast.Assign) and a.value is node and any(
                isinstance(t, ast.Name) and t.id == "READ_KEYS" for t in a.targets):
            return True
    return False


WINDOW = 6  # consecutive statement lines: what `duplicates` (the review tool) calls a repeated run


def _jit_bodies() -> dict[str, list[str]]:
    """{module:function: normalised body lines} of every @triton.jit function in nsa_core (docstring,
    blank and comment lines dropped, whitespace stripped)."""
    out = {}
    for m, path in MODULES.items():
        if not m.startswith("nsa_core"):
            continue
        src = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(src))):
            if not isinstance(node, ast.FunctionDef) or not any(
                    "jit" in ast.unparse(d) for d in node.decorator_list):
                continue
            body = node.body[1:] if (node.body and isinstance(node.body[0], ast.Expr)
                                     and isinstance(getattr(node.body[0], "value", None), ast.Constant)) else node.body
            lines = src[body[0].lineno - 1:node.end_lineno] if body else []
            out[f"{m}:{node.name}"] = [x.strip() for x in lines if x.strip() and not x.strip().startswith("#")]
    return out


def _repeated_runs(bodies: dict[str, list[str]], window: int = WINDOW) -> list[str]:
    seen: dict[tuple, str] = {}
    bad = []
    for name, lines in bodies.items():
        for i in range(len(lines) - window + 1):
            run = tuple(lines[i:i + window])
            where = f"{name}+{i}"
            if run in seen and not seen[run].startswith(name + "+"):
                bad.append(f"{seen[run]} == {where}: {run[0]} ...")
            seen.setdefault(run, where)
    return bad


def test_the_repeat_finder_finds_a_planted_copy():
    body = [f"x{i} = y + {i}" for i in range(8)]
    assert _repeated_runs({"a:f": body, "b:g": ["z = 1"] + body})
    assert not _repeated_runs({"a:f": body, "b:g": body[:WINDOW - 1]})


def test_no_kernel_body_is_repeated():
    """Issue 17: the Triton kernels share @triton.jit helpers instead of repeating their bodies."""
    bodies = _jit_bodies()
    assert len(bodies) > 20, sorted(bodies)  # the scan sees the kernels
    bad = _repeated_runs(bodies)
    assert not bad, "kernel code repeated (move it into a shared @triton.jit helper): " + "; ".join(bad[:5])


def test_every_timing_goes_through_the_shared_timer():
    """Issue 17: one timer (nsa_runner/measure/timing.py). No stage, runner module or bench script
    keeps its own CUDA-event loop or triton's do_bench."""
    import re

    pattern = re.compile(r"cuda\.Event\(|\bdo_bench\(|\.elapsed_time\(")
    files = [p for d in ("stages", "nsa_runner", "bench") for p in (REPO / d).rglob("*.py")]
    bad = [f"{p.relative_to(REPO)}:{i}" for p in files if p.name != "timing.py"
           for i, line in enumerate(p.read_text().splitlines(), 1)
           if pattern.search(line) and not line.lstrip().startswith("#")]
    assert files and not bad, bad
