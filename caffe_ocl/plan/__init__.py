"""The planning stage between Net and the launches.

Net builds its layers and exposes the result as a read-only graph
(``net.graph``, caffe_ocl.net.NetGraph). The passes here read only that
graph and return groups of layers to run as one:

- ``fold.py``: TEST-phase folding of BatchNorm/Scale/activations into the
  producing Convolution/InnerProduct (``chain.py``: the folded chain, in
  place or writing new tops);
- ``axpy.py``: TEST-phase SENet Axpy -> ReLU as one pass;
- ``dw_pointwise.py``: TEST-phase depthwise convolution and the 1x1
  convolution reading it as one launch (GPUs, batch-1 sizes);
- ``eltwise.py``: Eltwise SUM -> activation as one kernel (TEST and TRAIN);
- ``swish.py``: TEST-phase Swish/SiLU, hard swish and hard sigmoid as
  ONNX-converted nets write them (Sigmoid/Power/Clip * x), in the
  producer's epilogue;
- ``se.py``: TEST-phase SE channel scale folded into the next 1x1
  convolution's weights (per image);
- ``permute.py``: TEST-phase 1x1 Convolution / InnerProduct whose
  weight is a permutation matrix (a converted channel shuffle) run as a
  channel gather while it is one;
- ``concat.py``: TEST-phase Concat in place (the convolutions computing
  its inputs write them into their slices of its top); at TEST and TRAIN,
  a Concat extending an earlier Concat's inputs copies that top as one
  block;
- ``train.py``: the TRAIN fusions (BatchNorm/Scale/activation chains,
  ResNet block tails, Convolution -> ReLU forwards, ReLU gates inside the
  next layer's backward, Split gradients summed by a convolution);
- ``memory.py``: the diff memory plan (activation diffs share buffers by
  liveness) and BatchNorm -> Scale's one saved x_norm;
- ``patterns.py``: the helpers they share (in-place chains on a blob, a
  layer's activation, the consumers/writers of a blob);
- ``execution.py``: ``build(net)`` -> ``ExecutionPlan``, the forward and
  backward steps Net runs.

Import the submodules (``from caffe_ocl.plan import execution``); this
package module imports none of them.
"""
