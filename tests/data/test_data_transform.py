"""DataTransformer against NumPy references written here (Caffe's
data_transformer.cpp loops), including the crop/mirror distribution."""
import numpy as np
import pytest

import caffe_ocl
from caffe_ocl.data.transformer import DataTransformer
from caffe_ocl.errors import DataError
from caffe_ocl.proto import caffe_pb2, write_binary
from google.protobuf import text_format

TRAIN, TEST = caffe_pb2.TRAIN, caffe_pb2.TEST


def tparam(text):
    p = caffe_pb2.TransformationParameter()
    text_format.Parse(text, p)
    return p


def caffe_ref(img, crop, scale, mean=None, mean_values=None, mirror=False, h_off=0, w_off=0):
    """Element loop of DataTransformer::Transform(const Datum&, Dtype*)."""
    c, H, W = img.shape
    h, w = (crop, crop) if crop else (H, W)
    out = np.zeros((c, h, w), np.float32)
    for ci in range(c):
        for y in range(h):
            for x in range(w):
                e = np.float32(img[ci, h_off + y, w_off + x])
                xo = w - 1 - x if mirror else x
                if mean is not None:
                    v = (e - np.float32(mean[ci, h_off + y, w_off + x])) * np.float32(scale)
                elif mean_values is not None:
                    mv = mean_values[ci] if len(mean_values) > 1 else mean_values[0]
                    v = (e - np.float32(mv)) * np.float32(scale)
                else:
                    v = e * np.float32(scale)
                out[ci, y, xo] = v
    return out


def replay_draws(seed, n, H, W, crop, mirror, train):
    """Caffe's draw order (Rand(2) for mirror first, then h_off, w_off) on a
    Generator seeded like the transformer's."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        m = mirror and bool(rng.integers(2))
        ho = wo = 0
        if crop:
            if train:
                ho = int(rng.integers(H - crop + 1))
                wo = int(rng.integers(W - crop + 1))
            else:
                ho, wo = (H - crop) // 2, (W - crop) // 2
        out.append((m, ho, wo))
    return out


@pytest.fixture
def img(rng):
    return rng.integers(0, 256, (3, 7, 9), dtype=np.uint8)


def test_scale_only(img):
    t = DataTransformer(tparam("scale: 0.00390625"), TEST, np.random.default_rng(0))
    np.testing.assert_array_equal(t.transform(img), caffe_ref(img, 0, 0.00390625))


def test_mean_file_centre_crop_test_phase(tmp_path, img, rng):
    mean = rng.uniform(0, 255, (1, 3, 7, 9)).astype(np.float32)
    bp = caffe_pb2.BlobProto(num=1, channels=3, height=7, width=9)
    bp.data.extend(mean.ravel().tolist())
    write_binary(bp, str(tmp_path / "mean.binaryproto"))
    t = DataTransformer(tparam(f'mean_file: "{tmp_path / "mean.binaryproto"}" crop_size: 4 '
                               'scale: 0.5'), TEST, np.random.default_rng(0))
    assert t.infer_shape(img.shape) == (3, 4, 4)
    ref = caffe_ref(img, 4, 0.5, mean=mean[0], h_off=1, w_off=2)
    np.testing.assert_array_equal(t.transform(img), ref)


@pytest.mark.parametrize("values", [[10.5], [1.0, 20.0, 300.0]])
def test_mean_values(img, values):
    text = " ".join(f"mean_value: {v}" for v in values) + " scale: 2"
    t = DataTransformer(tparam(text), TEST, np.random.default_rng(0))
    t.infer_shape(img.shape)
    np.testing.assert_array_equal(t.transform(img),
                                  caffe_ref(img, 0, 2.0, mean_values=values))


def test_float_input(rng):
    x = rng.standard_normal((2, 5, 5)).astype(np.float32)
    t = DataTransformer(tparam("mean_value: 0.25 scale: 3 crop_size: 3"), TEST,
                        np.random.default_rng(0))
    np.testing.assert_array_equal(t.transform(x),
                                  caffe_ref(x, 3, 3.0, mean_values=[0.25], h_off=1, w_off=1))


def test_train_crop_mirror_replays_seeded_draws(img):
    n = 60
    t = DataTransformer(tparam("crop_size: 5 mirror: true mean_value: 3"), TRAIN,
                        np.random.default_rng(77))
    draws = replay_draws(77, n, 7, 9, 5, True, True)
    for m, ho, wo in draws:
        ref = caffe_ref(img, 5, 1.0, mean_values=[3.0], mirror=m, h_off=ho, w_off=wo)
        np.testing.assert_array_equal(t.transform(img), ref)


def test_crop_mirror_distribution_under_seed(img):
    """Offsets uniform over [0, H-crop] x [0, W-crop], mirror ~ 1/2: checked
    by identifying every output among the 2*3*5 possible ones."""
    t = DataTransformer(tparam("crop_size: 5 mirror: true"), TRAIN, np.random.default_rng(5))
    cands = {}
    for ho in range(3):
        for wo in range(5):
            for m in (False, True):
                cands[caffe_ref(img, 5, 1.0, mirror=m, h_off=ho, w_off=wo).tobytes()] = \
                    (m, ho, wo)
    n = 3000
    counts = {}
    for _ in range(n):
        key = cands[t.transform(img).tobytes()]
        counts[key] = counts.get(key, 0) + 1
    assert len(counts) == 30                          # every crop and mirror occurs
    expected = n / 30
    chi2 = sum((c - expected) ** 2 / expected for c in counts.values())
    assert chi2 < 60                                  # 29 dof: p ~ 0.0006
    mirrored = sum(c for k, c in counts.items() if k[0])
    assert abs(mirrored / n - 0.5) < 0.04


def test_test_phase_mirror_only_no_random_crop(img):
    t = DataTransformer(tparam("crop_size: 3 mirror: true"), TEST, np.random.default_rng(3))
    draws = replay_draws(3, 20, 7, 9, 3, True, False)
    for m, ho, wo in draws:
        assert (ho, wo) == (2, 3)
        np.testing.assert_array_equal(t.transform(img),
                                      caffe_ref(img, 3, 1.0, mirror=m, h_off=2, w_off=3))


def test_batch_fast_path_equals_per_image(rng):
    imgs = rng.integers(0, 256, (4, 3, 5, 5), dtype=np.uint8)
    t = DataTransformer(tparam("mean_value: 1 mean_value: 2 mean_value: 3 scale: 0.1"), TEST,
                        np.random.default_rng(0))
    out = np.empty((4, 3, 5, 5), np.float32)
    t.transform_batch(imgs, out)
    for i in range(4):
        np.testing.assert_array_equal(out[i], caffe_ref(imgs[i], 0, 0.1,
                                                        mean_values=[1, 2, 3]))


def test_data_layer_transform_reproducible(tmp_path, rng):
    import lmdb
    from caffe_ocl.testing import forward, make_layer
    imgs = rng.integers(0, 256, (6, 2, 6, 6), dtype=np.uint8)
    env = lmdb.open(str(tmp_path / "db"), map_size=1 << 24)
    with env.begin(write=True) as txn:
        for i, im in enumerate(imgs):
            txn.put(b"%02d" % i, caffe_pb2.Datum(channels=2, height=6, width=6,
                                                 data=im.tobytes(), label=i).SerializeToString())
    env.close()
    text = f'''type: "Data" top: "data" top: "label"
        data_param {{ source: "{tmp_path / 'db'}" backend: LMDB batch_size: 6 }}
        transform_param {{ crop_size: 4 mirror: true }}'''
    runs = []
    for _ in range(2):
        caffe_ocl.set_random_seed(2024)
        layer, b, t = make_layer(text, [], phase=TRAIN, ntop=2)
        runs.append([forward(layer, b, t)[0] for _ in range(3)])
        layer.close()
    for a, b_ in zip(*runs):
        np.testing.assert_array_equal(a, b_)
    # every output is one of the record's crops (mirrored or not)
    for x, im in zip(runs[0][0], imgs):
        opts = [caffe_ref(im, 4, 1.0, mirror=m, h_off=h, w_off=w)
                for m in (0, 1) for h in range(3) for w in range(3)]
        assert any(np.array_equal(x, o) for o in opts)


def test_bad_parameters(tmp_path, img):
    with pytest.raises(DataError, match="mean_file and mean_value"):
        DataTransformer(tparam('mean_file: "x" mean_value: 1'), TEST)
    with pytest.raises(DataError, match="force_color and force_gray"):
        DataTransformer(tparam("force_color: true force_gray: true"), TEST)
    t = DataTransformer(tparam("mean_value: 1 mean_value: 2"), TEST)
    with pytest.raises(DataError, match="1 mean_value or as many as channels"):
        t.infer_shape(img.shape)
    t = DataTransformer(tparam("crop_size: 8"), TEST)
    with pytest.raises(DataError, match="crop_size 8"):
        t.infer_shape(img.shape)
    with pytest.raises(DataError, match=r"mean file .*nope.binaryproto not found"):
        DataTransformer(tparam(f'mean_file: "{tmp_path / "nope.binaryproto"}"'), TEST)
    (tmp_path / "bad.binaryproto").write_bytes(b"\xff\xff\xff")
    with pytest.raises(DataError, match="bad.binaryproto"):
        DataTransformer(tparam(f'mean_file: "{tmp_path / "bad.binaryproto"}"'), TEST)
