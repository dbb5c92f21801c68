"""`caffe_ocl extract_features`: features of named blobs into LMDBs."""
import logging

from ..device import get_device, set_device, set_mode_cpu, set_mode_gpu
from ..data.features import extract_features
from ..errors import FlagError
from ..net import TEST, Net
from ._common import require_hdf5_for, start_log
from .flags import Arg, Spec
from ._common import UNTRUSTED, apply_untrusted

SUMMARY = "features of named blobs into LMDBs (Caffe's extract_features)"

log = logging.getLogger("caffe_ocl")

SPEC = Spec(
    "caffe_ocl extract_features", SUMMARY,
    flags=[UNTRUSTED],
    args=[Arg("pretrained_net_param", "the trained .caffemodel", check="files"),
          Arg("feature_extraction_proto_file", "the net prototxt (TEST phase) whose data "
              "layer reads the inputs", check="file"),
          Arg("extract_feature_blob_name1[,name2,...]", "blobs to save"),
          Arg("save_feature_dataset_name1[,name2,...]", "one new LMDB per blob"),
          Arg("num_mini_batches", "forward passes to run"),
          Arg("db_type", "lmdb (the only backend)", optional=True),
          Arg("CPU/GPU", "GPU: use the OpenCL GPU DEVICE_ID; CPU: an OpenCL CPU device; "
              "left out: the default device", optional=True),
          Arg("DEVICE_ID", "device id with GPU (default 0)", optional=True)],
    example="caffe_ocl extract_features bvlc_reference_caffenet.caffemodel "
            "imagenet_val.prototxt fc7,fc8 features_fc7,features_fc8 10 lmdb GPU 0",
    details="One Datum per item and blob: float_data the item's values, channels/height/"
            "width the blob's (N x C x H x W; 1 for missing axes), keys %010d from 0, as "
            "Caffe writes them. Blob and database names are comma-separated, one database "
            "per blob.")


def main(argv):
    opts = SPEC.parse(argv)
    apply_untrusted(opts)
    a = opts.args
    weights, model, blobs, dbs = a[0], a[1], a[2].split(","), a[3].split(",")
    try:
        num_batches = int(a[4])
    except ValueError:
        raise FlagError(f"num_mini_batches must be an integer, got {a[4]!r}") from None
    if not 0 <= num_batches < 2**31:
        # Caffe's int (atoi), as the int32 --iterations of test/time: 10^20
        # mini-batches never ended
        raise FlagError(f"num_mini_batches expects an integer in [0, 2147483647], "
                        f"got {a[4]!r}")
    if len(blobs) != len(dbs):
        raise FlagError(f"{len(blobs)} blob name(s) but {len(dbs)} database name(s): the "
                        "number of blob names and dataset names must be equal")
    db_type = a[5] if len(a) > 5 else "lmdb"
    if db_type != "lmdb":
        raise FlagError(f"db_type {db_type!r} is not supported (lmdb only)")
    mode = a[6].upper() if len(a) > 6 else ""
    if mode not in ("", "CPU", "GPU"):
        raise FlagError(f"expected CPU or GPU after db_type, got {a[6]!r}")
    try:
        device_id = int(a[7]) if len(a) > 7 else 0
    except ValueError:
        raise FlagError(f"DEVICE_ID must be an integer, got {a[7]!r}") from None
    if not -2**31 <= device_id < 2**31:
        raise FlagError(f"DEVICE_ID expects an integer in [-2147483648, 2147483647], "
                        f"got {a[7]!r}")
    require_hdf5_for([weights], "caffe_ocl extract_features")
    start_log()
    if mode == "GPU":
        log.info("Using GPU")
        log.info("Using Device_id=%d", device_id)
        set_mode_gpu()
        set_device(device_id)
    elif mode == "CPU":
        log.info("Using CPU")
        set_mode_cpu()
    dev = get_device()
    log.info("Use OpenCL device %s (%s)", dev.name, dev.reason)
    net = Net(model, weights, TEST)
    extract_features(net, blobs, dbs, num_batches, source=model)
    return 0
