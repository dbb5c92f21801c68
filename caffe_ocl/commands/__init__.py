"""The `caffe_ocl` command: Caffe's `caffe` tool plus its companions.

    caffe_ocl train --solver S [--weights W | --snapshot S] [--gpu N]
    caffe_ocl test --model M --weights W [--iterations N]
    caffe_ocl time --model M [--iterations N]
    caffe_ocl <command> -h        (every command's flags, defaults, an example)
    caffe_ocl --help | --version

Every command lives in its own module of this package; nothing outside
this package imports it (library code stays in the library: the commands
parse argv, check inputs, call the library, print, and return an exit
status).

Convention for a command module (``caffe_ocl/commands/<module>.py``):

- ``main(argv) -> int``: argv is the arguments after the command name;
  returns the exit status (0 on success).
- ``COMMAND = "name"``: the command's name (default: the module's name;
  set it where the name would shadow a standard module, e.g. time_cmd.py
  is ``time``).
- ``SUMMARY = "one line"``: what ``caffe_ocl --help`` lists (default: the
  first line of the module's docstring).
- ``SPEC = flags.Spec(...)`` (optional): its flags and arguments; ``main``
  parses with ``SPEC.parse(argv)``, which also answers ``-h``/``--help``.

The dispatcher finds the modules by reading their source (no import until
a command runs), so a new command is one new module and nothing else.
Modules whose name starts with ``_`` and modules without a top-level
``main`` (flags.py, deps.py) are not commands.

Every error the library raises on purpose (CaffeOclError) is printed as one
line, ``caffe_ocl <command>: error: <message>``, and the command exits with
status 1, without a traceback.
"""
import ast
import difflib
import importlib
import os
import pkgutil
import sys

from .. import startup
from ..errors import CaffeOclError
from .flags import HELP, VERSION, HelpRequested, version_text


def _describe(path, module):
    """(command name, summary) of a module file, or None when it is not a
    command (no top-level ``def main``)."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None
    name, summary, has_main = module, None, False
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "main":
            has_main = True
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Name) and \
                isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            if node.targets[0].id == "COMMAND":
                name = node.value.value
            elif node.targets[0].id == "SUMMARY":
                summary = node.value.value
    if not has_main:
        return None
    if summary is None:
        doc = ast.get_docstring(tree) or ""
        summary = doc.strip().splitlines()[0] if doc.strip() else ""
        summary = summary.strip("`").split("`: ", 1)[-1] if summary.startswith("`") else summary
    return name, summary


def registry():
    """{command name: (module name, summary)}, sorted by command name."""
    found = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_") or info.ispkg:
            continue
        path = os.path.join(__path__[0], info.name + ".py")
        d = _describe(path, info.name)
        if d is not None:
            found[d[0]] = (f"{__name__}.{info.name}", d[1])
    return dict(sorted(found.items()))


# the order `caffe_ocl --help` lists the commands in (Caffe's tool first);
# commands not named here follow in alphabetical order
ORDER = ("train", "test", "time", "tune", "device_query", "config", "demo", "classify")


def usage():
    cmds = registry()
    names = [n for n in ORDER if n in cmds] + [n for n in cmds if n not in ORDER]
    width = max((len(n) for n in names), default=10) + 2
    lines = ["usage: caffe_ocl <command> [args]    (caffe_ocl <command> -h: its flags)",
             "       caffe_ocl --version", "", "commands:"]
    lines += [f"  {n:<{width}} {cmds[n][1]}" for n in names]
    return "\n".join(lines)


def _one_line(msg):
    """An error message on one line: a newline inside it (a path holding
    one) is written as \\n."""
    return msg.strip().replace("\r", "\\r").replace("\n", "\\n")


def run(name, argv):
    """Run command ``name`` with ``argv``; returns the exit status. Help
    and errors are printed here."""
    cmds = registry()
    if name not in cmds:
        close = difflib.get_close_matches(name, list(cmds), n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]}?" if close else ""
        print(f"caffe_ocl: unknown command {name!r}{hint}\n\n{usage()}", file=sys.stderr)
        return 1
    if list(argv) in (["--version"], ["-version"]):
        print(version_text())
        return 0
    module = importlib.import_module(cmds[name][0])
    try:
        startup.end()     # from here a Ctrl-C is a KeyboardInterrupt, caught below
        rc = module.main(list(argv))
    except HelpRequested as h:
        print(h.text)
        return 0
    except CaffeOclError as e:
        print(f"caffe_ocl {name}: error: {_one_line(str(e))}", file=sys.stderr)
        return 1
    except OSError as e:
        # a file the command writes or reads failed (an output folder under
        # /dev/null, a full disk, no permission): one line, as Caffe's
        # LOG(FATAL), not a traceback
        where = f"{e.filename}: " if e.filename else ""
        print(f"caffe_ocl {name}: error: {where}{_one_line(e.strerror or str(e))}",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"caffe_ocl {name}: interrupted", file=sys.stderr)
        return 130
    return 0 if rc is None else int(rc)


def main(argv=None):
    """The command line; a reader that closes the pipe early
    (``caffe_ocl train --help | head``) ends it quietly, status 141 as
    SIGPIPE gives a Unix tool."""
    try:
        rc = _dispatch(argv)
        startup.guard()     # a Ctrl-C while the interpreter shuts down: one line, 130
        sys.stdout.flush()
        return rc
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)   # no second error at exit's flush
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141


def _dispatch(argv):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in HELP or argv[0] == "help":
        if len(argv) > 1 and argv[0] == "help":
            return run(argv[1], ["--help"])
        print(usage())
        return 0
    if argv[0] in VERSION or argv[0] == "version":
        print(version_text())
        return 0
    return run(argv[0], argv[1:])


if __name__ == "__main__":
    sys.exit(main())
