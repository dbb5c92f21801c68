"""Every `caffe_ocl` command helps itself: -h/--help/--version, "did you
mean" for commands and flags, each command lists only its own flags; the
one flag parser (caffe_ocl/commands/flags.py) takes every gflags spelling."""
import importlib
import re
import subprocess
import sys

import pytest

from caffe_ocl import __version__
from caffe_ocl import commands
from caffe_ocl.commands import flags as F
from caffe_ocl.errors import FileNotFound, FlagError
from conftest import ROOT

REGISTRY = commands.registry()
EXPECTED = {"train", "test", "time", "tune", "device_query", "config", "classify", "demo",
            "convert_imageset", "compute_image_mean", "convert_mnist_data", "draw_net",
            "plot_log", "onnx2caffe", "caffe2onnx", "extract_features",
            "upgrade_net_proto_text", "upgrade_net_proto_binary", "upgrade_solver_proto_text",
            "convert_cifar_data", "convert_mnist_siamese_data", "parse_log", "data", "detect"}


def _spec(name):
    """The command's flags.Spec (None for a module on the older
    parse_flags interface)."""
    spec = getattr(importlib.import_module(REGISTRY[name][0]), "SPEC", None)
    return spec if isinstance(spec, F.Spec) else None


def test_registry_finds_every_command_module():
    assert EXPECTED <= set(REGISTRY)
    # helpers of the package are no commands
    assert not {"flags", "deps", "_common"} & set(REGISTRY)
    for name, (module, summary) in REGISTRY.items():
        assert module.startswith("caffe_ocl.commands."), name
        assert summary and "\n" not in summary, name
    assert REGISTRY["time"][0] == "caffe_ocl.commands.time_cmd"
    assert REGISTRY["test"][0] == "caffe_ocl.commands.score"


def test_top_level_help_version_and_mistyped_command(capsys):
    assert commands.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in REGISTRY:
        assert re.search(rf"^  {name} +\S", out, re.M), name
    assert commands.main([]) == 0
    capsys.readouterr()
    for v in ("--version", "-version"):
        assert commands.main([v]) == 0
        assert capsys.readouterr().out.strip() == f"caffe_ocl {__version__}"
    assert commands.main(["trian", "--solver", "x"]) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[0] == "caffe_ocl: unknown command 'trian'; did you mean train?"
    assert commands.main(["convert_imagset"]) == 1
    assert "did you mean convert_imageset?" in capsys.readouterr().err
    assert commands.main(["help", "parse_log"]) == 0
    assert capsys.readouterr().out.startswith("usage: caffe_ocl parse_log")


@pytest.mark.parametrize("name", sorted(REGISTRY))
@pytest.mark.parametrize("opt", ["-h", "--help", "-help"])
def test_every_command_answers_help(name, opt, capsys):
    assert commands.main([name, opt]) == 0
    cap = capsys.readouterr()
    assert cap.err == ""
    out = cap.out
    assert out.startswith(f"usage: caffe_ocl {name}"), out[:80]
    spec = _spec(name)
    assert spec is not None, f"{name}: no SPEC (caffe_ocl/commands/flags.py's Spec)"
    assert "example:" in out and f"caffe_ocl {name}" in out.split("example:")[1]
    for flag in spec.flags.values():
        # each flag with its default and a line of help
        m = re.search(rf"^  --{flag.name}\b.*?\[default: ([^\]]*)\]", out, re.M | re.S)
        assert m, (name, flag.name)
        assert flag.help.split()[0] in out
    for arg in spec.args:
        assert arg.name in out


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_command_answers_version(name, capsys):
    assert commands.main([name, "--version"]) == 0
    assert capsys.readouterr().out.strip() == f"caffe_ocl {__version__}"


@pytest.mark.parametrize("name", sorted(n for n in REGISTRY if _spec(n) is not None
                                        and _spec(n).flags))
def test_unknown_flag_says_did_you_mean(name, capsys):
    flag = next(iter(_spec(name).flags))
    typo = flag[:-1] + ("x" if flag[-1] != "x" else "y")       # one letter off
    assert commands.main([name, f"--{typo}=1"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"caffe_ocl {name}: error: unknown flag '--{typo}=1'; "
                          f"did you mean --{flag}?")
    assert err.count(f"caffe_ocl {name}:") == 1        # no doubled prefix


def test_each_command_lists_only_its_own_flags(capsys):
    commands.main(["test", "--help"])
    out = capsys.readouterr().out
    for f in ("--model", "--weights", "--iterations", "--gpu", "--level", "--stage"):
        assert f in out
    for f in ("--solver", "--snapshot", "--sigint_effect", "--sighup_effect", "--phase"):
        assert f not in out
    commands.main(["train", "--help"])
    out = capsys.readouterr().out
    assert "--solver" in out and "--sigint_effect" in out
    assert "--model" not in out and "--iterations" not in out
    assert commands.main(["test", "--solver", "s.prototxt"]) == 1
    assert "unknown flag '--solver'" in capsys.readouterr().err


def test_old_entry_point_still_dispatches(capsys):
    # a console script installed before the move names caffe_ocl.cli:main
    from caffe_ocl import cli
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"caffe_ocl {__version__}"


def test_help_through_the_installed_entry_point():
    out = subprocess.run([sys.executable, "-m", "caffe_ocl", "train", "-h"], cwd=str(ROOT),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("usage: caffe_ocl train")
    assert "Traceback" not in out.stderr


NEW_MODULE = '''"""`caffe_ocl newcmd`: a command module dropped into commands/."""
from caffe_ocl.commands.flags import Arg, Flag, Spec

COMMAND = "newcmd"
SPEC = Spec("caffe_ocl newcmd", "a command module dropped into commands/",
            flags=[Flag("model", str, "", "a model"), Flag("scale", float, 1.0, "a factor")],
            args=[Arg("INPUT", "an input", optional=True, many=True)],
            example="caffe_ocl newcmd --model m p")


def main(argv):
    opts = SPEC.parse(argv)
    print("ran", opts.model, opts.scale, list(opts.args))
    return 0
'''


def test_a_new_module_is_a_command_without_a_registry_edit(tmp_path, monkeypatch, capsys):
    """What another module in commands/ gets: discovery from its source,
    help, version and did-you-mean through the dispatcher."""
    (tmp_path / "newcmd_mod.py").write_text(NEW_MODULE)
    assert commands._describe(str(tmp_path / "newcmd_mod.py"), "newcmd_mod") == \
        ("newcmd", "a command module dropped into commands/.")
    (tmp_path / "helper_mod.py").write_text("X = 1\n")
    assert commands._describe(str(tmp_path / "helper_mod.py"), "helper_mod") is None
    monkeypatch.syspath_prepend(str(tmp_path))
    real = commands.registry
    monkeypatch.setattr(commands, "registry", lambda: dict(
        real(), newcmd=("newcmd_mod", "a command module dropped into commands/")))
    assert commands.main(["newcmd", "--model", "m", "p"]) == 0
    assert capsys.readouterr().out.startswith("ran m 1.0 ['p']")
    assert commands.main(["newcmd", "-h"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: caffe_ocl newcmd") and "--scale X" in out
    assert commands.main(["newcmd", "--version"]) == 0
    assert capsys.readouterr().out.strip() == f"caffe_ocl {__version__}"
    assert commands.main(["newcmd", "--modle", "m"]) == 1
    assert capsys.readouterr().err.startswith(
        "caffe_ocl newcmd: error: unknown flag '--modle'; did you mean --model?")
    assert "newcmd" in commands.usage() and commands.main(["newcm"]) == 1
    assert "did you mean newcmd?" in capsys.readouterr().err


# --------------------------------------------------------------------------
# the parser

SPEC = F.Spec("caffe_ocl demo_cmd", "a test command",
              flags=[F.Flag("solver", str, "", "s"), F.Flag("iterations", int, 50, "n"),
                     F.Flag("scale", float, 1.0, "x"), F.Flag("shuffle", bool, False, "b"),
                     F.Flag("input_shape", str, None, "r", repeat=True)],
              args=[F.Arg("SRC"), F.Arg("REST", optional=True, many=True)],
              example="caffe_ocl demo_cmd x")


@pytest.mark.parametrize("argv", [["-solver", "s.p", "a"], ["--solver", "s.p", "a"],
                                  ["--solver=s.p", "a"], ["-solver=s.p", "a"],
                                  ["a", "--solver", "s.p"]])
def test_every_gflags_spelling(argv):
    o = SPEC.parse(argv)
    assert o.solver == "s.p" and o.args == ["a"] and o.given == {"solver"}
    assert o.iterations == 50 and o["scale"] == 1.0 and o.shuffle is False


def test_values_booleans_repeats_and_positionals():
    o = SPEC.parse(["--iterations", "-3", "--scale=-1.5e-2", "--shuffle", "a", "b", "c"])
    assert (o.iterations, o.scale, o.shuffle, o.args) == (-3, -0.015, True, ["a", "b", "c"])
    assert SPEC.parse(["--shuffle=false", "a"]).shuffle is False
    assert SPEC.parse(["--shuffle=1", "a"]).shuffle is True
    assert SPEC.parse(["--noshuffle", "a"]).shuffle is False
    assert SPEC.parse(["--input_shape", "x=1,2", "-input_shape=y=3", "a"]).input_shape == \
        ["x=1,2", "y=3"]
    assert SPEC.parse(["a", "--", "--solver"]).args == ["a", "--solver"]
    for bad, msg in [(["--iterations", "many", "a"], "--iterations expects an integer, got "
                                                      "'many'"),
                     (["--shuffle=maybe", "a"], "--shuffle takes true or false"),
                     (["a", "--solver"], "flag --solver needs a value"),
                     ([], "expects SRC REST ...; got 0 argument(s)"),
                     (["--solvr", "x", "a"], "did you mean --solver?"),
                     (["--zzz", "a"], "flags: --solver, --iterations")]:
        with pytest.raises(FlagError, match=re.escape(msg)):
            SPEC.parse(bad)
    two = F.Spec("caffe_ocl two", args=[F.Arg("A"), F.Arg("B"), F.Arg("C", optional=True)])
    with pytest.raises(FlagError, match=r"expects A B C; got 4 argument\(s\)"):
        two.parse(["1", "2", "3", "4"])
    assert two.parse(["1", "2"]).args == ["1", "2"]


def test_help_text_lists_defaults_and_example():
    with pytest.raises(F.HelpRequested) as h:
        SPEC.parse(["a", "--help"])
    text = h.value.text
    assert text.startswith("usage: caffe_ocl demo_cmd [flags] SRC [REST ...]")
    assert re.search(r"--iterations N +n \[default: 50\]", text)
    assert re.search(r"--shuffle \(--noshuffle\) +b \[default: false\]", text)
    assert re.search(r"--solver S +s \[default: none\]", text)
    assert text.rstrip().endswith("example:\n  caffe_ocl demo_cmd x")


def test_file_checks_name_the_flag_and_the_file(tmp_path):
    spec = F.Spec("caffe_ocl x", flags=[F.Flag("weights", str, "", "w", check="files"),
                                        F.Flag("model", str, "", "m", check="file")],
                  args=[F.Arg("DIR", check="dir")])
    a = tmp_path / "a.caffemodel"
    a.write_bytes(b"")
    ok = spec.parse([f"--weights={a}, {a}", str(tmp_path)])
    assert ok.weights.startswith(str(a))
    with pytest.raises(FileNotFound, match=rf"^--weights: file not found: {tmp_path}/b$"):
        spec.parse([f"--weights={a},{tmp_path / 'b'}", str(tmp_path)])
    with pytest.raises(FileNotFound, match="--model: expected a file, found a folder"):
        spec.parse(["--model", str(tmp_path), str(tmp_path)])
    with pytest.raises(FileNotFound, match="DIR: expected a folder, found a file"):
        spec.parse([str(a)])
    with pytest.raises(FileNotFound, match="DIR: folder not found"):
        spec.parse([str(tmp_path / "nope")])
    assert spec.parse([str(tmp_path / "nope")], check=False).args == [str(tmp_path / "nope")]
