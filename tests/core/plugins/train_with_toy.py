"""train.py's own loop on a backend registered from outside the package.

Usage: torchrun --nproc_per_node 2 tests/core/plugins/train_with_toy.py [train.py arguments]
"""

import os
import sys

import paraflow

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # toy_backend
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))  # train.py
paraflow.register_backend("toy", "toy_backend:ToyBackend", description="averages gradients in step()")

import train  # noqa: E402

if __name__ == "__main__":
    train.main(["--backend", "toy", *sys.argv[1:]])
