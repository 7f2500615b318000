"""scripts/install_torch.py: which torch `make install` installs, and the line that says why."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
from conftest import ROOT

spec = importlib.util.spec_from_file_location("install_torch", ROOT / "scripts" / "install_torch.py")
install_torch = importlib.util.module_from_spec(spec)
sys.modules["install_torch"] = install_torch
spec.loader.exec_module(install_torch)

# A Python whose pip records what it is asked for and serves only the torch builds listed in SERVES;
# its `-c` prints the description of the torch "installed" last.
FAKE_PYTHON = """#!/bin/sh
here="$(dirname "$0")"
if [ "$1" = -c ]; then
    [ -f "$here/installed" ] && cat "$here/installed" && exit 0
    exit 1
fi
shift 2
echo "$*" >> "$here/asked"
for build in $(cat "$here/serves"); do
    case " $* " in *" torch==$build "*) echo "$build (%s build)" > "$here/installed"; exit 0;; esac
done
echo "ERROR: No matching distribution found for $3" >&2
exit 1
"""


@pytest.fixture
def fake_python(tmp_path):
    def make(serves: str, build: str = "CPU"):
        python = tmp_path / "python"
        python.write_text(FAKE_PYTHON % build)
        python.chmod(0o755)
        (tmp_path / "serves").write_text(serves)
        return python

    return make


def _asked(python) -> list[str]:
    path = python.parent / "asked"
    return path.read_text().splitlines() if path.exists() else []


def test_a_torch_already_in_the_environment_is_kept_and_named(capsys, monkeypatch):
    monkeypatch.setattr(install_torch, "plan", lambda *a: pytest.fail("must not install anything"))
    assert install_torch.install(sys.executable, None) == 0
    import torch

    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU"
    assert capsys.readouterr().out == f"torch {torch.__version__} ({build} build): already in this environment, kept\n"


def test_no_gpu_takes_the_cpu_build_from_pips_own_sources_first(fake_python, monkeypatch, capsys):
    python = fake_python("2.13.0+cpu")
    monkeypatch.setattr(install_torch, "gpu_present", lambda: None)
    monkeypatch.setattr(install_torch, "cpu_index_reachable", lambda: False)
    assert install_torch.install(str(python), None) == 0
    assert _asked(python) == ["install -q torch==2.13.0+cpu"]
    assert capsys.readouterr().out == (
        "torch 2.13.0+cpu (CPU build): no GPU here, so the CPU build, from pip's configured sources\n"
    )


def test_no_cpu_build_anywhere_installs_pypis_cuda_build_and_says_so_in_one_line(fake_python, monkeypatch, capsys):
    python = fake_python("2.13.0", build="CUDA 13.0")
    monkeypatch.setattr(install_torch, "gpu_present", lambda: None)
    monkeypatch.setattr(install_torch, "cpu_index_reachable", lambda: False)
    assert install_torch.install(str(python), None) == 0
    assert _asked(python) == ["install -q torch==2.13.0+cpu", "install -q torch==2.13.0"]
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("torch 2.13.0 (CUDA 13.0 build): no GPU here, but only the CUDA build can be had")
    assert "https://download.pytorch.org/whl/cpu unreachable" in last and "PARAFLOW_TORCH_SPEC" in last


def test_the_cpu_index_is_tried_when_it_answers(fake_python, monkeypatch):
    python = fake_python("nothing")
    monkeypatch.setattr(install_torch, "gpu_present", lambda: None)
    monkeypatch.setattr(install_torch, "cpu_index_reachable", lambda: True)
    assert install_torch.install(str(python), None) == 1
    assert _asked(python)[1] == "install -q torch==2.13.0+cpu --extra-index-url https://download.pytorch.org/whl/cpu"
    assert len(_asked(python)) == 3


def test_a_gpu_takes_pypis_cuda_build(fake_python, monkeypatch, capsys):
    python = fake_python("2.13.0", build="CUDA 13.0")
    monkeypatch.setattr(install_torch, "gpu_present", lambda: "/dev/nvidia0 exists")
    monkeypatch.setattr(install_torch, "cpu_index_reachable", lambda: True)
    assert install_torch.install(str(python), None) == 0
    assert _asked(python) == ["install -q torch==2.13.0"]
    assert "(CUDA 13.0 build): /dev/nvidia0 exists, so PyPI's CUDA build" in capsys.readouterr().out


@pytest.mark.parametrize(
    "spec, args",
    [
        (
            "/w/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
            ["/w/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"],
        ),
        ("torch==2.13.0+cpu --index-url https://x/cpu", ["torch==2.13.0+cpu", "--index-url", "https://x/cpu"]),
    ],
)
def test_paraflow_torch_spec_is_what_pip_installs(spec, args):
    (attempt,) = install_torch.plan(spec, gpu="nvidia-smi lists a GPU", cpu_index=True)
    assert list(attempt.args) == args and attempt.reason == f"PARAFLOW_TORCH_SPEC={spec}"


def test_gpu_evidence_is_a_working_nvidia_smi_or_a_device_node():
    smi = lambda tool: "/usr/bin/nvidia-smi" if tool == "nvidia-smi" else None  # noqa: E731
    ok = lambda *a, **k: subprocess.CompletedProcess(a, 0)  # noqa: E731
    broken = lambda *a, **k: subprocess.CompletedProcess(a, 9)  # noqa: E731
    none = lambda pattern: []  # noqa: E731
    assert install_torch.gpu_present(smi, ok, none) == "nvidia-smi lists a GPU"
    assert install_torch.gpu_present(smi, broken, none) is None
    assert install_torch.gpu_present(lambda t: None, broken, lambda p: ["/dev/nvidiactl", "/dev/nvidia0"]) == (
        "/dev/nvidia0 exists"
    )
