"""Checker of how a package uses llama-cpp-python, over each module's :mod:`ast` (nothing
of the package is imported). :func:`check_source` reports, as ``"file:line: message"``:

a. a private name of ``llama_cpp``: ``import llama_cpp._internals``, ``from llama_cpp
   import _x``, or an attribute ``_x`` read on a module, class or object that comes from
   ``llama_cpp`` (a name an import bound to it, ``X = <that>``, ``self.x = <that>``, a call
   of it, a function of the module returning it; ``getattr(obj, "_x")`` counts as a read);
b. an attribute read ``obj._x`` (``obj`` other than ``self`` / ``cls``) where ``_x`` is a
   private attribute of llama-cpp-python's public classes (``llama_cpp.Llama``'s
   ``_scores``, ``_model``, ``_create_completion``, ..., LlamaGrammar's ``_grammar``): the
   type of ``obj`` is not known statically, so the name decides;
c. a method, classmethod or property of ``llama_cpp.Llama`` taken from the class
   (``llama_cpp.Llama.create_completion(self, ...)``, ``Llama._init_sampler(self)``,
   ``classmethod(Llama.from_pretrained.__func__)``): its code would run with a self that
   is not a ``llama_cpp.Llama``; static methods are fine;
d. a class deriving from ``llama_cpp.Llama`` (``super()`` would run its methods on ours).

``allowed``: ``{(file name, attribute)}`` reads that are known and documented.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Set, Tuple

LLAMA_CLASS = ("llama_cpp.Llama", "llama_cpp.llama.Llama")


def _private_attrs(cls) -> Set[str]:
    """``_x`` names of ``cls``: its class attributes and the ``self._x`` its source assigns."""
    names = {n for n in vars(cls) if n.startswith("_") and not n.endswith("__")}
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
            and node.attr.startswith("_")
            and not node.attr.endswith("__")
        ):
            names.add(node.attr)
    return names


def llama_cpp_facts() -> Tuple[Set[str], Dict[str, str]]:
    """(private attribute names of llama-cpp-python's public classes, ``{name: kind}`` of
    ``llama_cpp.Llama``'s callables and properties: "function" | "classmethod" |
    "staticmethod" | "property")."""
    import llama_cpp
    from llama_cpp import llama_cache, llama_chat_format

    classes = [
        llama_cpp.Llama,
        llama_cpp.LlamaGrammar,
        llama_cpp.LlamaState,
        llama_cpp.LlamaTokenizer,
        llama_cache.LlamaRAMCache,
        llama_cache.LlamaDiskCache,
        llama_chat_format.Jinja2ChatFormatter,
    ]
    private: Set[str] = set()
    for c in classes:
        private |= _private_attrs(c)
    kinds = {}
    for name, v in vars(llama_cpp.Llama).items():
        kind = (
            "staticmethod"
            if isinstance(v, staticmethod)
            else "classmethod"
            if isinstance(v, classmethod)
            else "property"
            if isinstance(v, property)
            else "function"
            if inspect.isfunction(v)
            else None
        )
        if kind:
            kinds[name] = kind
    return private, kinds


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.endswith("__")


class _Checker:
    def __init__(self, tree: ast.AST, private: Set[str], kinds: Dict[str, str], allow: Set[str]):
        self.tree, self.private, self.kinds, self.allow = tree, private, kinds, allow
        self.bound: Dict[str, str] = {}  # local name or "self.x" -> dotted llama_cpp path
        self.out: List[Tuple[int, str]] = []

    # ---- what comes from llama_cpp ----

    def origin(self, node: ast.AST) -> Optional[str]:
        """The llama_cpp path ``node`` evaluates to (a call adds "()"), or None."""
        if isinstance(node, ast.Name):
            return self.bound.get(node.id)
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                return self.bound.get(f"self.{node.attr}")
            base = self.origin(node.value)
            return f"{base}.{node.attr}" if base else None
        if isinstance(node, ast.Call):
            base = self.origin(node.func)
            return f"{base}()" if base else None
        return None

    def bind_imports(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] != "llama_cpp":
                        continue
                    if any(_is_private(p) for p in a.name.split(".")):
                        self.out.append((node.lineno, f"imports the private module {a.name}"))
                    self.bound[a.asname or "llama_cpp"] = a.name if a.asname else "llama_cpp"
            elif (
                isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "llama_cpp"
            ):
                mod = node.module
                if any(_is_private(p) for p in mod.split(".")):
                    self.out.append((node.lineno, f"imports from the private module {mod}"))
                for a in node.names:
                    if _is_private(a.name):
                        self.out.append((node.lineno, f"imports the private name {mod}.{a.name}"))
                    self.bound[a.asname or a.name] = f"{mod}.{a.name}"

    def bind_values(self) -> None:
        """Names and ``self.x`` assigned from llama_cpp values, and functions returning
        them (repeated until nothing changes: an alias of an alias)."""
        while True:
            before = dict(self.bound)
            for node in ast.walk(self.tree):
                if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                    src = self.origin(node.value)
                    if src:
                        for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                            key = (
                                t.id
                                if isinstance(t, ast.Name)
                                else f"self.{t.attr}"
                                if isinstance(t, ast.Attribute)
                                and isinstance(t.value, ast.Name)
                                and t.value.id in ("self", "cls")
                                else None
                            )
                            if key:
                                self.bound[key] = src
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    for r in ast.walk(node):
                        if isinstance(r, ast.Return) and r.value is not None and self.origin(r.value):
                            self.bound[node.name] = self.origin(r.value)
            if self.bound == before:
                return

    # ---- the rules ----

    def check(self) -> List[Tuple[int, str]]:
        self.bind_imports()
        self.bind_values()
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Attribute):
                self.attribute(node, node.value, node.attr)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "getattr"
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
            ):
                self.attribute(node, node.args[0], node.args[1].value)
            elif isinstance(node, ast.ClassDef):
                for b in node.bases:
                    if self.origin(b) in LLAMA_CLASS:
                        self.out.append((node.lineno, f"class {node.name} derives from llama_cpp.Llama"))
        return sorted(set(self.out))

    def attribute(self, node: ast.AST, obj: ast.AST, attr: str) -> None:
        if attr in self.allow:
            return
        src = self.origin(obj)
        if src in LLAMA_CLASS and self.kinds.get(attr) in ("function", "classmethod", "property"):
            self.out.append(
                (
                    node.lineno,
                    f"takes llama_cpp.Llama.{attr} ({self.kinds[attr]}) from the class: "
                    f"its code would run on a self that is not a llama_cpp.Llama",
                )
            )
        elif _is_private(attr) and src:
            self.out.append((node.lineno, f"reads the private {attr} of {src} (llama_cpp)"))
        elif (
            _is_private(attr) and attr in self.private and not (isinstance(obj, ast.Name) and obj.id in ("self", "cls"))
        ):
            self.out.append((node.lineno, f"reads {attr}, a private attribute of llama-cpp-python's classes"))


def check_source(text: str, name: str, facts=None, allowed: Iterable[Tuple[str, str]] = ()) -> List[str]:
    """The violations of one module's source ``text`` (``name`` labels them)."""
    private, kinds = facts or llama_cpp_facts()
    allow = {a for f, a in allowed if Path(name).as_posix().endswith(f)}
    found = _Checker(ast.parse(text, filename=name), private, kinds, allow).check()
    return [f"{name}:{line}: {msg}" for line, msg in found]


def check_tree(root: Path, allowed: Iterable[Tuple[str, str]] = ()) -> List[str]:
    """The violations of every ``.py`` file under ``root``."""
    facts = llama_cpp_facts()
    out = []
    for f in sorted(root.rglob("*.py")):
        if "__pycache__" not in f.parts:
            out += check_source(f.read_text(), str(f.relative_to(root.parent)), facts, allowed)
    return out
