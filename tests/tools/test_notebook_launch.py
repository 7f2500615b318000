"""paraflow.launch inside a real Jupyter kernel (nbclient): a function defined in a cell runs on 2 ranks."""

import json
import sys

import pytest

nbformat = pytest.importorskip("nbformat", reason="the test extra installs nbformat")
nbclient = pytest.importorskip("nbclient", reason="the test extra installs nbclient")
pytest.importorskip("ipykernel", reason="the test extra installs ipykernel")

CELLS = [
    # the kernel has used torch and runs threads of its own before the launch, as notebooks do
    "import threading, torch, paraflow\ntorch.ones(2).sum(); threading.Thread(target=lambda: None).start()",
    "def per_rank(backend, scale):\n"
    "    print(f'rank {backend.rank} of {backend.world_size} here')\n"
    "    return backend.allreduce(torch.tensor([float(backend.rank + 1)]), op='sum').item() * scale",
    "print('RESULT', paraflow.launch(per_rank, 10, nprocs=2, backend='ddp-gloo', time_limit=240))",
    "def broken(backend):\n"
    "    if backend.rank == 1:\n"
    "        raise KeyError('missing on rank one')\n"
    "    backend.barrier()\n"
    "try:\n"
    "    paraflow.launch(broken, nprocs=2, backend='ddp-gloo', time_limit=240)\n"
    "except paraflow.RankFailedError as err:\n"
    "    print('FAILED', err.rank, err.error_type)\n"
    "    print(err.traceback)",
]


def test_a_function_defined_in_a_notebook_cell_runs_on_two_ranks(no_leftovers, monkeypatch, tmp_path):
    # a kernel of this very Python, found before any "python3" kernel installed on the machine
    spec = tmp_path / "kernels" / "paraflow-test"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "paraflow", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    client = nbclient.NotebookClient(notebook, timeout=300, kernel_name="paraflow-test")
    client.execute()
    outputs = ["".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream") for cell in notebook.cells]
    assert "RESULT [30.0, 30.0]" in outputs[2]
    # worker output is streamed into the cell that called launch, with the rank prefix
    assert "[rank0] rank 0 of 2 here" in outputs[2] and "[rank1] rank 1 of 2 here" in outputs[2]
    assert "FAILED 1 KeyError" in outputs[3]
    # the cell's source line is shown in the traceback, though cloudpickle sent the code by value
    assert "raise KeyError('missing on rank one')" in outputs[3]
