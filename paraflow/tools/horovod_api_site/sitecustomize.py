"""Python runs this at start-up in each process of a ``paraflow run --horovod-api`` job.

It first runs the ``sitecustomize`` it shadows (if any), then installs the finder that answers
``import horovod.torch`` with ``paraflow.compat.horovod`` (paraflow/tools/horovod_api.py).
"""

import importlib.util
import os
import sys


def _run_the_shadowed_sitecustomize(here: str) -> None:
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    this = sys.modules.pop("sitecustomize", None)
    spec = importlib.util.find_spec("sitecustomize")
    if spec is None or not spec.origin or os.path.dirname(os.path.abspath(spec.origin)) == here:
        sys.modules["sitecustomize"] = this  # none other: this one stays (Python's import expects it there)
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _install_the_finder(here: str) -> None:
    path = os.path.join(os.path.dirname(here), "horovod_api.py")
    spec = importlib.util.spec_from_file_location("_paraflow_horovod_api_hook", path)
    hook = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = hook
    spec.loader.exec_module(hook)
    hook.install()


_here = os.path.dirname(os.path.abspath(__file__))
_run_the_shadowed_sitecustomize(_here)
_install_the_finder(_here)
