import os
import sys

from .commands import main

# `python -m caffe_ocl` put the current folder first on sys.path: a model's
# Python layer must not import a module from wherever the command is run
# (issue #25) unless the user's own PYTHONPATH names that folder
if sys.path and sys.path[0] in ("", os.getcwd()) and os.getcwd() not in [
        os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]:
    del sys.path[0]

sys.exit(main())
