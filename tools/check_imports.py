#!/usr/bin/env python3
"""Check caffe_ocl's import structure (issue #22); CI runs it before pytest.

Reads every module of the package with ``ast`` (nothing is imported) and
fails on:

  cycle     an import cycle between caffe_ocl modules (imports inside
            functions count: a loop dodged that way is still a loop);
  upward    a module importing a module of a higher layer (LAYERS below);
  function  an import of a caffe_ocl module inside a function (allowed
            only where FUNCTION_IMPORTS_ALLOWED says why; lazy imports of
            optional third-party packages such as onnx, h5py, mpi4py, cv2
            are not caffe_ocl modules and are fine);
  private   the use of another module's underscore-private name: ``from m
            import _x``, ``m._x`` on an imported caffe_ocl module, or an
            import of a private module (``pkg/_x.py``) from outside its
            package;
  env       a CAFFE_OCL_* environment variable read or written through
            os.environ / os.getenv anywhere but caffe_ocl/config.py (every
            setting goes through config.get / config.set);
  unplaced  a module that no entry of LAYERS places.

    python3 tools/check_imports.py                   # every violation, exit 1 if any
    python3 tools/check_imports.py --baseline FILE   # fail only on ones not in FILE
    python3 tools/check_imports.py --write-baseline FILE
    python3 tools/check_imports.py --graph           # the module graph, by layer

A baseline lists known violations (one ``rule|module|detail`` a line) that
are being removed; entries no longer found are reported as fixed.
"""
import argparse
import ast
import fnmatch
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "caffe_ocl"

# The layer order, lowest first. A module may import modules of its own
# layer or of lower layers, never of a higher one. Patterns are module names
# without the "caffe_ocl." prefix (fnmatch; "" is the package itself); the
# first matching entry places a module. docs/ARCHITECTURE.md describes the
# same order.
LAYERS = [
    # (ranks: Caffe::solver_count/solver_rank, read by layers and solvers)
    ("base", ["errors", "config", "logs", "paths", "ranks", "startup"]),
    # one OpenCL device: context, queue, program cache, memory pool, scratch
    ("device", ["device", "cl_enqueue"]),
    # primitives: Python launch builders over kernels/*.cl
    ("ops", ["ops", "ops.*"]),
    ("blob", ["blob"]),
    # caffe.proto, text/binary readers and writers, upgraders
    ("proto", ["proto", "proto.*"]),
    # record formats and readers (LMDB/LevelDB, Datum, image lists,
    # transformer, prefetch); the rest of data/ (tools, converters, demo
    # data) sits with the features
    ("data", ["data", "data.datum", "data.db", "data.transformer", "data.prefetch",
              "data.paths", "data.image_list", "data.hdf5"]),
    # one class per Caffe layer type, the registry
    ("layers", ["layers", "layers.*"]),
    # planning passes over the net's public graph: memory plan, inference
    # folding, training fusions, the execution plan
    ("plan", ["plan", "plan.*"]),
    # Net and what it is made of (pycaffe's Net methods, HDF5 weights)
    ("net", ["net", "pycaffe_net", "hdf5_weights"]),
    # the Solver loop, update rules, learning-rate policies, snapshots, and
    # the checks on snapshot files (safe_io: it reads solver states, so it
    # sits above proto)
    ("solvers", ["solvers", "solvers.*", "safe_io"]),
    # library features above the training loop, and the library bodies the
    # commands call (training, timing, tuning, classify, data tools)
    ("features", ["parallel", "parallel.*", "io", "onnx", "onnx.*", "net_spec", "coord_map",
                  "draw", "classifier", "detector", "detection", "testing", "training",
                  "timing", "tuning", "classify", "data.*"]),
    # the pycaffe face: `import caffe_ocl as caffe`
    ("package", ["", "pycaffe"]),
    # command-line programs: nothing below imports them
    # (cli: the deprecated entry point of installs made before commands/ existed)
    ("commands", ["commands", "commands.*", "__main__",
                  "cli"]),
]


# (importing module, imported module) -> why an import inside a function is
# right there. Keep it short: each entry is a loop or an upward import the
# layer order would otherwise have to explain.
FUNCTION_IMPORTS_ALLOWED = {
}


def module_files(root=ROOT):
    """{module name: path} of every .py file of the package."""
    out = {}
    pkg = os.path.join(root, PACKAGE)
    for d, dirs, files in os.walk(pkg):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(d, f), root)[:-3].replace(os.sep, ".")
            if rel.endswith(".__init__"):
                rel = rel[:-len(".__init__")]
            out[rel] = os.path.join(d, f)
    return out


def short(mod):
    return mod[len(PACKAGE) + 1:] if mod.startswith(PACKAGE + ".") else \
        ("" if mod == PACKAGE else mod)


def layer_of(mod):
    """(index, name) of the layer placing ``mod``, or None."""
    s = short(mod)
    for i, (name, pats) in enumerate(LAYERS):
        if any(fnmatch.fnmatchcase(s, p) for p in pats):
            return i, name
    return None


class Import:
    __slots__ = ("src", "dst", "line", "in_function", "names")

    def __init__(self, src, dst, line, in_function, names=()):
        self.src, self.dst, self.line = src, dst, line
        self.in_function, self.names = in_function, names


def _resolve(mod, is_pkg, node):
    """Absolute module named by an ImportFrom node."""
    if node.level == 0:
        return node.module or ""
    parts = mod.split(".")
    if not is_pkg:
        parts = parts[:-1]
    if node.level > 1:
        parts = parts[:len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


ENV_ACCESSORS = ("get", "pop", "setdefault", "__getitem__")


class _Reader(ast.NodeVisitor):
    def __init__(self, mod, is_pkg, modules):
        self.mod, self.is_pkg, self.modules = mod, is_pkg, modules
        self.depth = 0
        self.imports = []
        self.module_aliases = {}      # local name -> caffe_ocl module it is bound to
        self.private_uses = []        # (line, module, name)
        self.env_uses = []            # (line, variable)
        self.str_consts = {}          # module-level NAME = "CAFFE_OCL_..."

    # ---- scopes
    def visit_FunctionDef(self, node):
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef
    visit_Lambda = visit_FunctionDef

    # ---- imports
    def visit_Import(self, node):
        for a in node.names:
            if a.name == PACKAGE or a.name.startswith(PACKAGE + "."):
                self.imports.append(Import(self.mod, a.name, node.lineno, self.depth > 0))
                if a.asname:
                    self.module_aliases[a.asname] = a.name

    def visit_ImportFrom(self, node):
        base = _resolve(self.mod, self.is_pkg, node)
        if not (base == PACKAGE or base.startswith(PACKAGE + ".")):
            return
        for a in node.names:
            full = f"{base}.{a.name}"
            if full in self.modules:         # a submodule
                self.imports.append(Import(self.mod, full, node.lineno, self.depth > 0))
                self.module_aliases[a.asname or a.name] = full
            else:                            # a name defined in module ``base``
                self.imports.append(Import(self.mod, base, node.lineno, self.depth > 0,
                                           (a.name,)))

    # ---- private attributes of imported modules, environment reads
    def visit_Attribute(self, node):
        if isinstance(node.value, ast.Name) and node.value.id in self.module_aliases:
            a = node.attr
            if a.startswith("_") and not (a.startswith("__") and a.endswith("__")):
                self.private_uses.append((node.lineno, self.module_aliases[node.value.id], a))
        self.generic_visit(node)

    def visit_Assign(self, node):
        if (self.depth == 0 and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
                and node.value.value.startswith("CAFFE_OCL_")):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    self.str_consts[t.id] = node.value.value
        self.generic_visit(node)

    def _env_key(self, node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value if node.value.startswith("CAFFE_OCL_") else None
        if isinstance(node, ast.Name):
            return self.str_consts.get(node.id)
        return None

    @staticmethod
    def _is_environ(node):
        return (isinstance(node, ast.Attribute) and node.attr == "environ"
                and isinstance(node.value, ast.Name) and node.value.id == "os")

    def visit_Call(self, node):
        f = node.func
        key = None
        if node.args and isinstance(f, ast.Attribute):
            if f.attr in ENV_ACCESSORS and self._is_environ(f.value):
                key = self._env_key(node.args[0])
            elif f.attr == "getenv" and isinstance(f.value, ast.Name) and f.value.id == "os":
                key = self._env_key(node.args[0])
        if key:
            self.env_uses.append((node.lineno, key))
        self.generic_visit(node)

    def visit_Subscript(self, node):
        if self._is_environ(node.value):
            key = self._env_key(node.slice)
            if key:
                self.env_uses.append((node.lineno, key))
        self.generic_visit(node)

    def visit_Compare(self, node):
        if (len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn))
                and self._is_environ(node.comparators[0])):
            key = self._env_key(node.left)
            if key:
                self.env_uses.append((node.lineno, key))
        self.generic_visit(node)


class Violation:
    __slots__ = ("rule", "module", "detail", "path", "line")

    def __init__(self, rule, module, detail, path="", line=0):
        self.rule, self.module, self.detail = rule, module, detail
        self.path, self.line = path, line

    @property
    def key(self):
        return f"{self.rule}|{short(self.module) or PACKAGE}|{self.detail}"

    def __str__(self):
        where = f"{self.path}:{self.line}" if self.path else short(self.module)
        return f"{where}: [{self.rule}] {self.detail}"


def read_package(root=ROOT):
    """(modules {name: path}, {name: _Reader})."""
    modules = module_files(root)
    readers = {}
    for mod, path in modules.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        r = _Reader(mod, path.endswith("__init__.py"), modules)
        r.visit(tree)
        readers[mod] = r
    return modules, readers


def _cycles(edges):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
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
            if len(comp) > 1 or v in edges.get(v, ()):
                out.append(sorted(comp))

    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def check(root=ROOT):
    """Every violation, sorted."""
    modules, readers = read_package(root)
    rel = {m: os.path.relpath(p, root) for m, p in modules.items()}
    found = []
    edges = {}
    for mod, r in readers.items():
        mine = layer_of(mod)
        if mine is None:
            found.append(Violation("unplaced", mod, "no entry of LAYERS in "
                                   "tools/check_imports.py places this module", rel[mod], 1))
        for imp in r.imports:
            dst = imp.dst
            if dst not in modules:
                continue                    # e.g. a name of the package itself
            if dst != mod:
                edges.setdefault(mod, set()).add(dst)
            theirs = layer_of(dst)
            if mine and theirs and theirs[0] > mine[0]:
                found.append(Violation("upward", mod, f"imports {short(dst) or PACKAGE} "
                                       f"(layer {theirs[1]}) from layer {mine[1]}",
                                       rel[mod], imp.line))
            if imp.in_function and dst != mod:
                why = FUNCTION_IMPORTS_ALLOWED.get((short(mod), short(dst)))
                if why is None:
                    found.append(Violation("function", mod, "imports "
                                           f"{short(dst) or PACKAGE} inside a function",
                                           rel[mod], imp.line))
            for name in imp.names:
                if name.startswith("_") and not name.startswith("__") and dst != mod:
                    found.append(Violation("private", mod, f"imports {name} from "
                                           f"{short(dst) or PACKAGE}", rel[mod], imp.line))
            last = dst.rsplit(".", 1)
            if (len(last) == 2 and last[1].startswith("_") and not last[1].startswith("__")
                    and not (mod == last[0] or mod.startswith(last[0] + "."))):
                found.append(Violation("private", mod, f"imports the private module "
                                       f"{short(dst)} from outside its package",
                                       rel[mod], imp.line))
        for line, target, name in r.private_uses:
            if target != mod:
                found.append(Violation("private", mod, f"uses {short(target) or PACKAGE}."
                                       f"{name}", rel[mod], line))
        if short(mod) != "config":
            for line, var in r.env_uses:
                found.append(Violation("env", mod, f"reads or writes {var} through os.environ "
                                       "(use caffe_ocl.config)", rel[mod], line))
    for comp in _cycles(edges):
        names = ", ".join(short(m) or PACKAGE for m in comp)
        found.append(Violation("cycle", comp[0], f"import cycle: {names}"))
    # one entry per (rule, module, detail): the first line where it occurs
    seen, out = set(), []
    for v in sorted(found, key=lambda v: (v.path, v.line, v.rule, v.detail)):
        if v.key not in seen:
            seen.add(v.key)
            out.append(v)
    return out, edges


def read_baseline(path):
    with open(path) as f:
        return {ln.strip() for ln in f if ln.strip() and not ln.startswith("#")}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", help="known violations: fail only on others")
    ap.add_argument("--write-baseline", metavar="FILE",
                    help="write every current violation to FILE and exit 0")
    ap.add_argument("--graph", action="store_true", help="print the module graph by layer")
    ap.add_argument("--root", default=ROOT, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    found, edges = check(a.root)
    if a.graph:
        by_layer = {}
        for m in sorted(set(edges) | {d for ds in edges.values() for d in ds}):
            lay = layer_of(m)
            by_layer.setdefault(lay[1] if lay else "?", []).append(m)
        for name, _ in LAYERS + [("?", None)]:
            for m in by_layer.get(name, ()):
                deps = ", ".join(sorted(short(d) or PACKAGE for d in edges.get(m, ())))
                print(f"[{name}] {short(m) or PACKAGE} -> {deps}")
        return 0
    if a.write_baseline:
        with open(a.write_baseline, "w") as f:
            f.write("# Known import-structure violations (tools/check_imports.py); "
                    "remove lines as they are fixed.\n")
            for v in found:
                f.write(v.key + "\n")
        print(f"{len(found)} violations written to {a.write_baseline}")
        return 0
    known = read_baseline(a.baseline) if a.baseline else set()
    new = [v for v in found if v.key not in known]
    fixed = sorted(known - {v.key for v in found})
    for v in new:
        print(v)
    for k in fixed:
        print(f"fixed (remove from {a.baseline}): {k}")
    if known:
        print(f"check_imports: {len(new)} new violations, "
              f"{len(found) - len(new)} known in the baseline, {len(fixed)} fixed")
    else:
        print(f"check_imports: {len(found)} violations")
    return 1 if new else 0


if __name__ == "__main__":
    sys.exit(main())
