"""Layer-rule checker over a package's import graph, built with :mod:`ast` (no text grep,
nothing imported or compiled).

Every ``import``, ``from ... import`` and relative import counts, wherever it is: inside
functions, ``try`` blocks and ``if TYPE_CHECKING:`` alike. ``from pkg import name`` is an
edge to ``pkg.name`` when that is a module of the package, else to ``pkg``. Python's
implicit import of a module's parent packages is not an edge. Imports of modules outside
the package are ignored; ``importlib.import_module("...")`` strings are not seen.

:func:`check_package` returns the violations as ``"file:line: message"`` strings:

a. an upward import (a module imports one of a higher layer), a module in no layer, or an
   import of a name under the package that is no module of it (a stale relative import);
b. the raw binding (``<native>.lib``, ``.ffi``, ``._pi_native``: anything of ``<native>``
   not in ``native_api``) reached from a module outside ``lib_allowed``, by
   ``from <native> import lib``, by importing ``<native>._pi_native``, or by attribute
   access ``X.lib`` on a name ``X`` that an import in that file bound to ``<native>``;
c. an import cycle among the modules (the package root ``__init__`` left out).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

NATIVE_API = ("enums", "check", "last_error", "set_isa", "isa_name", "supported_isas")


def _modules(folder: Path, name: str) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under ``folder`` (the package ``name``)."""
    out = {}
    for f in sorted(folder.rglob("*.py")):
        parts = list(f.relative_to(folder).with_suffix("").parts)
        if "__pycache__" not in parts:
            out[".".join([name, *parts[: -1 if parts[-1] == "__init__" else None]])] = f
    return out


def _imports(mod: str, path: Path, tree: ast.AST, known: dict[str, Path]):
    """Yield ``(line, target, attr, bind)`` for every import in ``tree``: ``target`` is the
    imported module, ``attr`` the name taken from it when that is not a submodule, and
    ``bind`` is ``(local name, dotted name it is bound to)``. A relative import above the
    top yields ``target`` None and the message as ``attr``."""
    here = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                head = a.name.partition(".")[0]  # `import a.b` binds `a`
                yield node.lineno, a.name, None, (a.asname, a.name) if a.asname else (head, head)
        elif isinstance(node, ast.ImportFrom):
            base, up = node.module or "", here.split(".")
            if node.level > len(up):
                yield node.lineno, None, f"{mod}: relative import above the top", None
                continue
            if node.level:
                base = ".".join(up[: len(up) - node.level + 1] + ([base] if base else []))
            for a in node.names:
                sub, bind = f"{base}.{a.name}", (a.asname or a.name, f"{base}.{a.name}")
                yield (node.lineno, sub, None, bind) if sub in known else (node.lineno, base, a.name, bind)


def _owner(name: str, known: dict[str, Path]) -> str:
    """The longest known module that ``name`` is or lies in (``pkg.mod.attr`` -> ``pkg.mod``)."""
    while name not in known and "." in name:
        name = name.rpartition(".")[0]
    return name


def _layer_of(mod: str, package: str, layers) -> int | None:
    """Index of the layer with the longest prefix matching ``mod``; the bare package name
    matches only the root ``__init__``, not everything under it."""
    hits = [
        (len(p), i)
        for i, (_, prefixes) in enumerate(layers)
        for p in prefixes
        if mod == p or (p != package and mod.startswith(p + "."))
    ]
    return max(hits)[1] if hits else None


def sccs(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        return v, iter(sorted(graph[v]))

    for start in sorted(graph):
        work = [] if start in index else [visit(start)]
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None and w not in index:
                work.append(visit(w))
            elif w is not None:
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = [stack.pop()]
                    while comp[-1] != v:
                        comp.append(stack.pop())
                    on.difference_update(comp)
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def _cycle_through(comp: list[str], graph: dict[str, dict[str, str]]) -> list[str]:
    """A shortest import cycle through the component's first module (BFS inside it)."""
    start, members = comp[0], set(comp)
    prev, frontier = {start: None}, [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v].keys() & members):
                if w == start:
                    path = [v]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    return [*reversed(path), start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return comp  # unreachable for a real component


def _report(found: list, rel: str, line: int, msg: str) -> None:
    found.append((rel, line, f"{rel}:{line}: {msg}"))


def check_package(
    root_dir: Path,
    package: str,
    layers: list[tuple[str, list[str]]],
    *,
    lib_allowed: list[str],
    native: str = "_native",
    native_api: tuple[str, ...] = NATIVE_API,
) -> list[str]:
    """Check ``root_dir/<package>`` against ``layers``, bottom to top: ``[(layer name, [module prefixes])]``.
    ``lib_allowed``: prefixes of the modules that may use ``<package>.<native>`` raw.
    Returns the violations, ``"file:line: message"``, sorted; empty when all is well."""
    root_dir = Path(root_dir)
    known = _modules(root_dir / package.replace(".", "/"), package)
    nat = f"{package}.{native}"

    def raw(m):
        return m.startswith(nat + ".") and m[len(nat) + 1 :].split(".")[0] not in native_api

    def allowed(m):
        return any(m == p or m.startswith(p + ".") for p in lib_allowed)

    where = f"outside {', '.join(lib_allowed)}"
    found, graph = [], {m: {} for m in known if m != package}  # the root is no cycle node
    for mod, path in known.items():
        rel = path.relative_to(root_dir)
        say = functools.partial(_report, found, str(rel))
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        me = _layer_of(mod, package, layers)
        if me is None:
            say(1, f"{mod} is in no layer of the table")
        bound = {}  # local name -> the dotted name an import in this file bound it to
        for line, target, attr, bind in _imports(mod, path, tree, known):
            if target is None:
                say(line, attr)
                continue
            if target != package and not target.startswith(package + "."):
                continue  # outside the package
            bound[bind[0]] = bind[1]
            full = target if attr is None else f"{target}.{attr}"
            if raw(full) and not allowed(mod):
                say(line, f"{mod} reaches the raw binding ({full}) {where}")
            owner = _owner(target, known)
            if owner != target and not target.startswith(nat + "."):  # the extension has no .py
                say(line, f"{mod} imports {target}, which is not a module of {package}")
            if owner == target and mod != package and owner not in (package, mod):
                graph[mod].setdefault(owner, f"{rel}:{line}")  # an unknown name: no parent edge
            them = _layer_of(owner, package, layers)
            if mod != package and None not in (me, them) and them > me:  # the root is exempt
                say(line, f"{mod} imports {owner} (layer {layers[me][0]} < {layers[them][0]})")
        for node in ast.walk(tree) if bound and not allowed(mod) else ():
            chain, v = [], node
            while isinstance(v, ast.Attribute):
                chain.append(v.attr)
                v = v.value
            if chain and isinstance(v, ast.Name) and v.id in bound:
                dotted = ".".join([bound[v.id], *reversed(chain)])
                if raw(dotted) and dotted.count(".") == nat.count(".") + 1:  # exactly <native>.X
                    say(node.lineno, f"{mod} reaches the raw binding ({dotted}) {where}")
    out = [msg for *_, msg in sorted(found)]
    for comp in sccs(graph):
        cyc = _cycle_through(comp, graph)
        out.append(
            f"import cycle: {' -> '.join(cyc)} ("
            + ", ".join(graph[a][b] for a, b in zip(cyc, cyc[1:]))
            + (f"; strongly connected: {', '.join(comp)})" if len(comp) > len(cyc) - 1 else ")")
        )
    return out
