"""pytest set-up: the package from python/ (the compiled core sits in python/gradscale)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402

torch.set_num_threads(1)  # bit-reproducible comparisons, and CI has two cores
