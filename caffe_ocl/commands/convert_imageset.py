"""`caffe_ocl convert_imageset`: write an image list into an LMDB of Datum records."""
from ..data.tools import convert_imageset
from ._common import start_log
from .flags import Arg, Flag, Spec

SUMMARY = "write an image list into an LMDB of Datum records (Caffe's convert_imageset)"

SPEC = Spec(
    "caffe_ocl convert_imageset", SUMMARY,
    flags=[Flag("gray", bool, False, "treat images as grayscale ones"),
           Flag("shuffle", bool, False, "randomly shuffle the order of images and their labels"),
           Flag("backend", str, "lmdb", "the backend for storing the result (lmdb only)"),
           Flag("resize_width", int, 0, "width images are resized to (0: keep)"),
           Flag("resize_height", int, 0, "height images are resized to (0: keep)"),
           Flag("check_size", bool, False, "check that all the datum have the same size"),
           Flag("encoded", bool, False, "store the encoded image in the datum"),
           Flag("encode_type", str, "", "what type the image is encoded as: png, jpg... "
                "(implies --encoded)")],
    args=[Arg("ROOTFOLDER/", "folder the list's paths are relative to (prefixed as given: "
              "keep the trailing /)"),
          Arg("LISTFILE", "lines 'subfolder1/file1.JPEG 7'", check="file"),
          Arg("DB_NAME", "the LMDB to create (must not exist)")],
    example="caffe_ocl convert_imageset --resize_height 32 --resize_width 32 --shuffle "
            "images/ train.txt train_lmdb",
    details="Keys are %08d_<path>, as Caffe writes them; unreadable images are logged "
            "and skipped.")


def main(argv):
    opts = SPEC.parse(argv)
    root, listfile, db = opts.args
    start_log()
    convert_imageset(root, listfile, db, gray=opts.gray, shuffle=opts.shuffle,
                     backend=opts.backend, resize_width=opts.resize_width,
                     resize_height=opts.resize_height, check_size=opts.check_size,
                     encoded=opts.encoded, encode_type=opts.encode_type)
    return 0
