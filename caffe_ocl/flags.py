"""gflags-compatible command-line parsing for Caffe's tools.

Caffe's tools take ``-solver S``, ``--solver S``, ``--solver=S`` and
``-solver=S``; boolean flags take ``--shuffle``, ``--shuffle=true``,
``--noshuffle``. User scripts use every spelling, so we accept them all.

    spec = {"solver": str, "iterations": int, "shuffle": bool}
    flags, positional = parse_flags(argv, spec, defaults={"iterations": 50})
"""
from .errors import CaffeOclError

_TRUE = {"true", "1", "yes", "t", "y"}
_FALSE = {"false", "0", "no", "f", "n"}


class FlagError(CaffeOclError):
    pass


def parse_flags(argv, spec, defaults=None, program="caffe_ocl"):
    flags = dict(defaults or {})
    positional = []
    i = 0
    argv = list(argv)
    while i < len(argv):
        a = argv[i]
        if a == "--":
            positional.extend(argv[i + 1:])
            break
        if a.startswith("-") and len(a) > 1 and not _is_number(a):
            body = a.lstrip("-")
            if "=" in body:
                name, value = body.split("=", 1)
                has_value = True
            else:
                name, value, has_value = body, None, False
            if name not in spec and name.startswith("no") and spec.get(name[2:]) is bool \
                    and not has_value:
                flags[name[2:]] = False
                i += 1
                continue
            if name not in spec:
                known = ", ".join(f"--{k}" for k in sorted(spec))
                raise FlagError(f"{program}: unknown flag {a!r} (known: {known})")
            kind = spec[name]
            if kind is bool:
                if has_value:
                    v = value.lower()
                    if v not in _TRUE | _FALSE:
                        raise FlagError(f"{program}: --{name} takes true or false, got {value!r}")
                    flags[name] = v in _TRUE
                else:
                    flags[name] = True
                i += 1
                continue
            if not has_value:
                if i + 1 >= len(argv):
                    raise FlagError(f"{program}: flag --{name} needs a value")
                value = argv[i + 1]
                i += 1
            try:
                flags[name] = kind(value)
            except ValueError:
                raise FlagError(f"{program}: --{name} expects {kind.__name__}, got {value!r}")
            i += 1
            continue
        positional.append(a)
        i += 1
    return flags, positional


def _is_number(s):
    try:
        float(s)
        return True
    except ValueError:
        return False
