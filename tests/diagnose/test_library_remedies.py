"""A library that cannot be loaded gets the remedy of where that library really comes from (issue 32):
the driver's own libcuda and libnvidia-* come with the NVIDIA driver (its package, the NVIDIA
Container Toolkit's mounts, cuda-compat for forward compatibility) and never with a pip wheel; the
CUDA toolkit's libraries come with the toolkit and as PyPI wheels (`nvidia-<name>-cu12` for CUDA 12,
`nvidia-<name>` for CUDA 13, cuDNN/NCCL/cuSPARSELt keeping `-cu13`); torch's own libraries with
torch. Sources are cited beside the table in ddtree_ops/diagnose/context.py and the rule's references."""

from __future__ import annotations

import pytest

from ddtree_ops.diagnose.classify import classify, load_catalogue
from ddtree_ops.diagnose.context import wheel_for


def _rc(line: str):  # noqa: ANN202 - a Finding
    rc = classify([line]).root_cause
    assert rc is not None and rc.label == "cuda_lib_load", rc
    return rc


@pytest.mark.parametrize("line", [
    "OSError: libcuda.so.1: cannot open shared object file: No such file or directory",
    "ImportError: libcuda.so: cannot open shared object file: No such file or directory",
    "ImportError: libnvidia-ml.so.1: cannot open shared object file: No such file or directory",
    "AssertionError: libcuda.so cannot found!",  # Triton's driver.py
])
def test_the_drivers_own_library_comes_with_the_driver_never_a_pip_wheel(line: str) -> None:
    rc = _rc(line)
    text = rc.meaning + " " + rc.remedy
    assert "never with a pip wheel" in rc.meaning and "pip install" not in text and "nvidia-cuda" not in text
    assert "wheel in service.python" not in text  # the words the old remedy gave for libcuda.so.1
    for source in ("driver is installed", "NVIDIA Container Toolkit", "cuda-compat"):
        assert source in rc.remedy, source
    assert rc.profile_key == "service.env"


def test_tritons_lookup_of_libcuda_says_how_triton_finds_it() -> None:
    assert "TRITON_LIBCUDA_PATH" in _rc("AssertionError: libcuda.so cannot found!").remedy
    assert "TRITON_LIBCUDA_PATH" not in _rc("OSError: libcuda.so.1: cannot open shared object file").remedy


@pytest.mark.parametrize("line, wheel", [
    ("ImportError: libnvrtc.so.12: cannot open shared object file: No such file or directory", "nvidia-cuda-nvrtc-cu12"),
    ("OSError: libcudart.so.13: cannot open shared object file: No such file or directory", "nvidia-cuda-runtime"),
    ("OSError: libcublasLt.so.12: cannot open shared object file: No such file or directory", "nvidia-cublas-cu12"),
    ("OSError: libnvJitLink.so.12: cannot open shared object file: No such file or directory", "nvidia-nvjitlink-cu12"),
    ("OSError: libcudnn.so.9: cannot open shared object file: No such file or directory",
     "nvidia-cudnn-cu12 or nvidia-cudnn-cu13"),  # cuDNN's soname is its own major, not CUDA's
    ("OSError: libnccl.so.2: cannot open shared object file: No such file or directory",
     "nvidia-nccl-cu12 or nvidia-nccl-cu13"),
    ("OSError: libcufft.so.11: cannot open shared object file: No such file or directory",
     "nvidia-cufft-cu12 or nvidia-cufft "),
])
def test_a_toolkit_library_names_the_toolkit_and_the_wheel_that_ships_it(line: str, wheel: str) -> None:
    rc = _rc(line)
    assert wheel in rc.remedy and "/usr/local/cuda/lib64" in rc.remedy and rc.profile_key == "service.python"
    assert "driver" not in rc.remedy


def test_torchs_own_library_is_torch_and_an_unknown_one_is_looked_up() -> None:
    torch = _rc("ImportError: libtorch_cuda.so: cannot open shared object file: No such file or directory")
    assert "CUDA build of torch" in torch.remedy and "nvidia-" not in torch.remedy
    other = _rc("OSError: libmoe_cuda_ext.so: cannot open shared object file: No such file or directory")
    assert "dpkg -S libmoe_cuda_ext.so" in other.remedy and "pip show -f" in other.remedy


def test_the_wheel_names_follow_pypi() -> None:
    assert wheel_for("libcudart.so.12") == "nvidia-cuda-runtime-cu12"
    assert wheel_for("libcudart.so.13") == "nvidia-cuda-runtime"  # nvidia-*-cu13 are deprecated stubs
    assert wheel_for("libcusparseLt.so.0") == "nvidia-cusparselt-cu12 or nvidia-cusparselt-cu13 (for torch's CUDA 12 or 13)"
    assert wheel_for("libcuda.so.1") is None and wheel_for("libnvidia-ml.so.1") is None


def test_no_remedy_of_the_catalogue_offers_a_wheel_for_the_drivers_library() -> None:
    """Every text an operator reads: where libcuda is named, no pip wheel is offered for it."""
    cat = load_catalogue()
    texts = [(r.id, r.remedy) for r in cat.rules] + [(f"{r.id}/{v.name}", v.remedy) for r in cat.rules for v in r.variants]
    for rid, text in texts:
        if "libcuda" in text and "stubs/" not in text:
            assert "nvidia-cuda" not in text and "matching nvidia-* wheel" not in text, rid
