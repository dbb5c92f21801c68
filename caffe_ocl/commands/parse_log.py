"""`caffe_ocl parse_log`: a Caffe training log as LOG.train and LOG.test CSV files."""
from ..data.parse_log import parse_log, save_csv_files
from ..errors import FlagError
from .flags import Arg, Flag, Spec

SUMMARY = "a Caffe training log as LOG.train / LOG.test CSV files (BVLC's parse_log.py)"

SPEC = Spec(
    "caffe_ocl parse_log", SUMMARY,
    flags=[Flag("delimiter", str, ",", "column delimiter in the output files"),
           Flag("verbose", bool, False, "print the names of the files written")],
    args=[Arg("logfile_path", "the training log (glog format, Caffe's or caffe_ocl's)",
              check="file"),
          Arg("output_dir", "folder the CSV files are written to", check="dir")],
    example="caffe_ocl parse_log train.log .",
    details="Columns: NumIters, Seconds, LearningRate, then the net's outputs "
            "(e.g. loss, accuracy) as the log names them.")


def main(argv):
    opts = SPEC.parse(argv)
    if len(opts.delimiter) != 1:
        raise FlagError(f"--delimiter must be one character, got {opts.delimiter!r}")
    train, test = parse_log(opts.args[0])
    paths = save_csv_files(opts.args[0], opts.args[1], train, test, opts.delimiter)
    if opts.verbose:
        for p in paths:
            print(f"Wrote {p}")
    return 0
