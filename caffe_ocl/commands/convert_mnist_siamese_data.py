"""`caffe_ocl convert_mnist_siamese_data`: MNIST IDX files to an LMDB of image pairs."""
from ..data.siamese import write_siamese_lmdb
from ..data.tools import read_idx
from ._common import start_log
from .flags import Arg, Flag, Spec

SUMMARY = "MNIST IDX files to an LMDB of random image pairs (Caffe's siamese example tool)"

SPEC = Spec(
    "caffe_ocl convert_mnist_siamese_data", SUMMARY,
    flags=[Flag("seed", int, 1, "seed of the pair drawing (Caffe's mt19937); -1: an entropy "
                "seed, as BVLC's unseeded tool")],
    args=[Arg("input_image_file", "IDX images (.gz accepted)", check="file"),
          Arg("input_label_file", "IDX labels (.gz accepted)", check="file"),
          Arg("output_db_file", "the LMDB to create")],
    example="caffe_ocl convert_mnist_siamese_data train-images-idx3-ubyte "
            "train-labels-idx1-ubyte mnist_siamese_train_lmdb",
    details="One pair per item: Datum 2 x rows x cols (image i, image j), label 1 when the "
            "digits are the same, keys %08d. The pairs are caffe_rng_rand() % N drawn from "
            "mt19937(--seed): the same seed gives the pairs of Caffe's tool after "
            "Caffe::set_random_seed(seed).")


def main(argv):
    opts = SPEC.parse(argv)
    start_log()
    images, labels = read_idx(opts.args[0], opts.args[1])
    write_siamese_lmdb(images, labels, opts.args[2], seed=None if opts.seed < 0 else opts.seed)
    return 0
