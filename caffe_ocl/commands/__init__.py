"""`caffe_ocl` commands, one module each with main(argv) -> int (see the cmd branch)."""
