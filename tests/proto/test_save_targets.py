"""Saving a net never replaces what is not a regular file and ends in one
error naming the file: a save writes a temp file beside the name and renames
it over the name, which as root swapped /dev/full for a regular file."""
import os

import pytest

import caffe_ocl
from caffe_ocl.errors import FileWriteError
from caffe_ocl.proto import parse_net_text

NET = ('layer { name: "data" type: "Input" top: "data" '
       'input_param { shape { dim: 1 dim: 2 } } }\n'
       'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
       'inner_product_param { num_output: 2 } }\n')


@pytest.fixture
def net():
    return caffe_ocl.Net(parse_net_text(NET), caffe_ocl.TEST)


def test_save_refuses_a_folder_and_a_device(net, tmp_path):
    folder = tmp_path / "weights"
    folder.mkdir()
    with pytest.raises(FileWriteError, match=rf"cannot write {folder}: it is a folder"):
        net.save(str(folder))
    assert folder.is_dir() and not os.listdir(folder)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(FileWriteError, match=rf"{fifo}: it is not a regular file"):
        net.save(str(fifo))
    assert not fifo.is_file()           # still the pipe (a device node is refused
    # the same way; not tried here: a regression would replace it, as root)
    assert sorted(os.listdir(tmp_path)) == ["pipe", "weights"]     # no temp file left


def test_save_into_a_missing_folder_is_one_error(net, tmp_path):
    path = tmp_path / "nodir" / "x.caffemodel"
    with pytest.raises(FileWriteError, match=rf"cannot write {path}: No such file"):
        net.save(str(path))
    with pytest.raises(FileWriteError, match="empty name"):
        net.save("")
    # still an OSError for callers that catch one
    with pytest.raises(OSError):
        net.save(str(path))


def test_save_over_a_regular_file_and_a_link_to_one(net, tmp_path):
    target = tmp_path / "w.caffemodel"
    target.write_bytes(b"old")
    net.save(str(target))
    assert target.read_bytes() != b"old"
    link = tmp_path / "link.caffemodel"
    link.symlink_to(target)
    net.save(str(link))
    caffe_ocl.Net(parse_net_text(NET), caffe_ocl.TEST).copy_from(str(link))


def test_save_hdf5_refuses_a_folder(net, tmp_path):
    pytest.importorskip("h5py")
    folder = tmp_path / "w.h5"
    folder.mkdir()
    with pytest.raises(FileWriteError, match="it is a folder"):
        net.save_hdf5(str(folder))
    assert folder.is_dir()
