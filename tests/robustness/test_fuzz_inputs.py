"""Seeded fuzzing of every input format (issue #25): each mutated file is
read through the entry point the commands use and must either work or give
a CaffeOclError of one line naming the file (tests/robustness/fuzzing.py).
LMDB cases and the command-level sample run in child processes, where a
signal (Bus error, an assertion abort), a traceback, a hang past a timeout
or memory past RLIMIT_AS would show. The default run is a few hundred cases
per format; ``-m slow`` runs thousands."""
import os

import pytest

import fuzzing
from caffe_ocl import config

HERE = os.path.dirname(os.path.abspath(__file__))

# cases per format in the default run (about 60 s in all on PoCL)
DEFAULT = {"prototxt": 120, "solver": 120, "caffemodel": 200, "caffemodel_v1": 150,
           "binaryproto": 300, "solverstate": 200, "imagelist": 120, "lmdb": 150}
SLOW = 3000


@pytest.fixture(scope="module")
def fuzz_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    with config.override(MEMORY_LIMIT_MB=512, HOST_MEMORY_LIMIT_MB=512):
        fuzzing.make_base(str(root / "base"))
        yield root


def _check(fmt, seeds, root):
    with config.override(MEMORY_LIMIT_MB=512, HOST_MEMORY_LIMIT_MB=512):
        counts, findings = fuzzing.run_cases(fmt, seeds, str(root / "base"), str(root))
    assert not findings, f"{len(findings)} findings, e.g. " + "; ".join(
        f"seed {s}: {f}" for s, f in findings[:5])
    # the mutations must reach both outcomes, or the harness tests nothing
    assert counts["error"] > 0 and counts["ok"] > 0, counts


IN_PROCESS = [f for f in fuzzing.FORMATS if f != "lmdb"]


@pytest.mark.parametrize("fmt", IN_PROCESS)
def test_fuzz_in_process(fmt, fuzz_root):
    _check(fmt, range(DEFAULT[fmt]), fuzz_root)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", IN_PROCESS)
def test_fuzz_in_process_many(fmt, fuzz_root):
    _check(fmt, range(10_000, 10_000 + SLOW), fuzz_root)


def _run_child_cases(fmt, first, count, root, timeout):
    """Run cases in a child; a case the child did not finish is a finding."""
    verdicts = fuzzing.run_child_cases(os.path.join(HERE, "fuzzing.py"), fmt, first, count,
                                       root, timeout)
    assert verdicts == {"ok", "error"}, verdicts


def test_fuzz_lmdb(tmp_path):
    _run_child_cases("lmdb", 0, DEFAULT["lmdb"], tmp_path, timeout=300)


@pytest.mark.slow
def test_fuzz_lmdb_many(tmp_path):
    _run_child_cases("lmdb", 10_000, SLOW, tmp_path, timeout=3000)
