"""The one flag parser of every ``caffe_ocl`` command (gflags-compatible).

Caffe's tools take ``-solver S``, ``--solver S``, ``--solver=S`` and
``-solver=S``; boolean flags take ``--shuffle``, ``--shuffle=true``,
``--noshuffle``. User scripts use every spelling, so every command accepts
them all. A command describes itself once, in a :class:`Spec`:

    SPEC = Spec("caffe_ocl train", "train a net from a solver prototxt",
                flags=[Flag("solver", str, "", "the solver prototxt", check="file"),
                       Flag("iterations", int, 50, "test iterations")],
                args=[Arg("IMAGE", "an image", many=True, check="file")],
                example="caffe_ocl train --solver models/lenet/lenet_solver.prototxt")
    opts = SPEC.parse(argv)      # opts.solver, opts["iterations"], opts.args

``-h``/``--help``/``-help`` raise :class:`HelpRequested` (the dispatcher in
``caffe_ocl.commands`` prints its text and exits 0); ``--version`` likewise
prints the version. An unknown flag, a bad value or a wrong number of
positional arguments raise :class:`FlagError` with one line (an unknown
flag names the closest known one: "did you mean --solver?"). Files named by
flags or arguments with ``check=`` are checked after parsing, before the
command does any work.
"""
import difflib
import os
import textwrap

from .. import __version__
from ..errors import FileNotFound, FlagError

__all__ = ["Arg", "Flag", "FlagError", "HelpRequested", "Options", "Spec", "check_path",
           "version_text"]

_TRUE = {"true", "1", "yes", "t", "y"}
_FALSE = {"false", "0", "no", "f", "n"}
HELP = ("-h", "--help", "-help", "--helpfull")
VERSION = ("--version", "-version")


def version_text():
    return f"caffe_ocl {__version__}"


class HelpRequested(Exception):
    """``-h``/``--help``/``--version`` was given; ``text`` is what to print
    (on stdout, exit status 0)."""

    def __init__(self, text):
        super().__init__(text)
        self.text = text


class Flag:
    """One flag: name, type (str, int, float or bool), default, one line of
    help. ``check``: "file" (must be a readable file), "files" (a
    comma-separated list of them), "dir" (an existing folder), "path" (must
    exist) or None."""

    def __init__(self, name, type=str, default=None, help="", metavar=None,  # noqa: A002
                 check=None, repeat=False):
        self.name, self.type, self.default, self.help = name, type, default, help
        self.repeat = repeat            # may be given several times: a list of values
        if repeat and default is None:
            self.default = []
        self.metavar = metavar or ("" if type is bool else
                                   {int: "N", float: "X"}.get(type, "S"))
        self.check = check


class Arg:
    """A positional argument. ``optional``: may be left out (only at the
    end); ``many``: takes every remaining argument (one or more, zero when
    optional)."""

    def __init__(self, name, help="", optional=False, many=False, check=None):  # noqa: A002
        self.name, self.help, self.optional, self.many = name, help, optional, many
        self.check = check


class Options(dict):
    """Parsed flags: ``opts["solver"]`` or ``opts.solver``; ``opts.args``:
    the positional arguments; ``opts.given``: names of flags on the line."""

    def __init__(self, values, args, given):
        super().__init__(values)
        self.args = list(args)
        self.given = set(given)

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _is_number(s):
    try:
        float(s)
        return True
    except ValueError:
        return False


def _type_name(kind):
    return {str: "a string", int: "an integer", float: "a number"}.get(kind, kind.__name__)


def check_path(path, check, what):
    """Raise FileNotFound (one line naming ``what`` and the file) unless
    ``path`` is what ``check`` asks for: "file", "files" (comma-separated),
    "dir" or "path"."""
    if check == "files":
        for p in str(path).split(","):
            if p.strip():
                check_path(p.strip(), "file", what)
        return
    p = os.fspath(path)
    if not os.path.exists(p):
        kind = {"dir": "folder"}.get(check, "file")
        raise FileNotFound(f"{what}: {kind} not found: {p}")
    if check == "file":
        if os.path.isdir(p):
            raise FileNotFound(f"{what}: expected a file, found a folder: {p}")
        if not os.path.isfile(p):      # a FIFO would block, a device never end
            raise FileNotFound(f"{what}: expected a regular file, found a special file "
                               f"(FIFO, socket or device): {p}")
        if not os.access(p, os.R_OK):
            raise FileNotFound(f"{what}: file not readable: {p}")
    elif check == "dir" and not os.path.isdir(p):
        raise FileNotFound(f"{what}: expected a folder, found a file: {p}")


class Spec:
    """What a command takes: its flags, its positional arguments, a summary
    line, an example; parses argv and writes the help."""

    def __init__(self, command, summary="", flags=(), args=(), example="", details=""):
        self.command, self.summary = command, summary
        self.flags = {f.name: f for f in flags}
        self.args = list(args)
        self.example, self.details = example, details

    # -- help ----------------------------------------------------------------
    def usage_line(self):
        parts = [f"usage: {self.command}"]
        if self.flags:
            parts.append("[flags]")
        for a in self.args:
            name = a.name + (" ..." if a.many else "")
            parts.append(f"[{name}]" if a.optional else name)
        return " ".join(parts)

    def help_text(self):
        lines = [self.usage_line()]
        if self.summary:
            lines += ["", self.summary]
        if self.details:
            lines += [""] + textwrap.wrap(self.details.strip(), 79)

        def table(rows):
            width = min(max(len(r[0]) for r in rows) + 2, 30)
            out = []
            for left, text in rows:
                # "[default: X]" stays on one line
                body = [b.replace("\0", " ") for b in
                        textwrap.wrap(text.replace("[default: ", "[default:\0"),
                                      max(79 - width - 3, 30))] or [""]
                if len(left) > width:
                    out.append(f"  {left}")
                    out += [f"  {'':<{width}} {b}" for b in body]
                else:
                    out.append(f"  {left:<{width}} {body[0]}")
                    out += [f"  {'':<{width}} {b}" for b in body[1:]]
            return out
        if self.args:
            lines += ["", "arguments:"] + table([(a.name, a.help) for a in self.args])
        if self.flags:
            lines += ["", "flags (also -name value, --name=value, -name=value):"]
            rows = []
            for f in self.flags.values():
                left = f"--{f.name}" + (f" {f.metavar}" if f.metavar else "")
                if f.type is bool:
                    default = "true" if f.default else "false"
                    left += " (--no" + f.name + ")"
                elif f.default in (None, "", []):
                    default = "none"
                else:
                    default = str(f.default)
                rows.append((left, f"{f.help} [default: {default}]"))
            lines += table(rows)
        lines += ["", "-h, --help: this help; --version: caffe_ocl's version"]
        if self.example:
            lines += ["", "example:"]
            lines += [f"  {e}" for e in self.example.strip().splitlines()]
        return "\n".join(lines)

    # -- parsing -------------------------------------------------------------
    def _unknown(self, arg, name):
        close = difflib.get_close_matches(name, list(self.flags), n=1, cutoff=0.6)
        if close:
            return FlagError(f"unknown flag {arg!r}; did you mean --{close[0]}? "
                             f"(see {self.command} --help)")
        known = ", ".join(f"--{k}" for k in self.flags) or "none"
        return FlagError(f"unknown flag {arg!r} (flags: {known}; see {self.command} --help)")

    def parse_raw(self, argv):
        """(values given {name: value}, positional list); no defaults, no checks."""
        values, positional = {}, []
        argv = list(argv)
        i = 0
        while i < len(argv):
            a = argv[i]
            if a == "--":
                positional.extend(argv[i + 1:])
                break
            if a in HELP:
                raise HelpRequested(self.help_text())
            if a in VERSION and "version" not in self.flags:
                raise HelpRequested(version_text())
            if a.startswith("-") and len(a) > 1 and not _is_number(a):
                body = a[2:] if a.startswith("--") else a[1:]
                if "=" in body:
                    name, value = body.split("=", 1)
                    has_value = True
                else:
                    name, value, has_value = body, None, False
                f = self.flags.get(name)
                if f is None and name.startswith("no") and not has_value:
                    g = self.flags.get(name[2:])
                    if g is not None and g.type is bool:
                        values[g.name] = False
                        i += 1
                        continue
                if f is None:
                    raise self._unknown(a, name)
                if f.type is bool:
                    if has_value:
                        v = value.lower()
                        if v not in _TRUE | _FALSE:
                            raise FlagError(f"--{name} takes true or false, got {value!r}")
                        values[name] = v in _TRUE
                    else:
                        values[name] = True
                    i += 1
                    continue
                if not has_value:
                    if i + 1 >= len(argv):
                        raise FlagError(f"flag --{name} needs a value ({_type_name(f.type)})")
                    value = argv[i + 1]
                    i += 1
                try:
                    v = f.type(value)
                    if f.type is int and not -2**31 <= v < 2**31:
                        # gflags' int32 flags: a bigger number is not a number of
                        # iterations (a --level past int32 was a ValueError traceback)
                        raise FlagError(f"--{name} expects an integer in "
                                        f"[-2147483648, 2147483647], got {value!r}")
                    if f.repeat:
                        values.setdefault(name, []).append(v)
                    else:
                        values[name] = v
                except ValueError:
                    raise FlagError(f"--{name} expects {_type_name(f.type)}, "
                                    f"got {value!r}") from None
                i += 1
                continue
            positional.append(a)
            i += 1
        return values, positional

    def _check_count(self, positional):
        need = sum(1 for a in self.args if not a.optional)
        many = any(a.many for a in self.args)
        most = None if many else len(self.args)
        n = len(positional)
        if n < need or (most is not None and n > most):
            names = " ".join(a.name + (" ..." if a.many else "") for a in self.args) \
                or "no arguments"
            got = ", ".join(repr(p) for p in positional) if positional else "none"
            raise FlagError(f"expects {names}; got {n} argument(s): {got} "
                            f"(see {self.command} --help)")

    def check_files(self, opts):
        """Check every file named by a flag or argument with ``check=``."""
        for f in self.flags.values():
            v = opts.get(f.name)
            if f.check and v not in (None, "", []):
                for one in (v if f.repeat else [v]):
                    check_path(one, f.check, f"--{f.name}")
        args = list(opts.args)
        for k, a in enumerate(self.args):
            if not a.check:
                continue
            for v in (args[k:] if a.many else args[k:k + 1]):
                check_path(v, a.check, a.name)

    def parse(self, argv, check=True):
        """Options (defaults filled in) for ``argv``; files checked unless
        ``check`` is False."""
        values, positional = self.parse_raw(argv)
        self._check_count(positional)
        full = {f.name: (list(f.default) if f.repeat else f.default)
                for f in self.flags.values()}
        full.update(values)
        opts = Options(full, positional, values)
        if check:
            self.check_files(opts)
        return opts

