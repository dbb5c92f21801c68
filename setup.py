# Packaging detail that pyproject.toml cannot express alone: the top-level
# models/ folder (prototxts and the CIFAR-10 weights) is installed inside the
# package as caffe_ocl/models, so `caffe_ocl demo`/`classify` find it after a
# plain `pip install .` as well as in a checkout.
from setuptools import find_packages, setup

setup(
    # ``caffe`` is pycaffe's import name (caffe/__init__.py), served by caffe_ocl.
    packages=find_packages(include=["caffe_ocl", "caffe_ocl.*", "caffe"]) + ["caffe_ocl.models"],
    package_dir={"caffe_ocl.models": "models"},
    package_data={
        "caffe_ocl": ["kernels/*.cl", "kernels/*.h", "proto/*.proto", "data/mnist/*"],
        "caffe_ocl.models": ["**/*"],
    },
)
