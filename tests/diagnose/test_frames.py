"""Causes named by where an exception was raised, on real logs from tests/data/logcorpus."""

from __future__ import annotations

from ddtree_ops.diagnose.classify import classify
from diagnose_helpers import CORPUS, as_journald, raw_lines


def _root(name: str):
    rc = classify(raw_lines(CORPUS / name)).root_cause
    assert rc is not None
    return rc


def test_assertion_in_a_models_speculative_hook_names_the_settings() -> None:
    # sgl-project/sglang#38236: DeepSeek-V4's hook refuses NEXTN; the paste has no Traceback header
    rc = _root("108-spec_decode_misconfig.log")
    assert rc.label == "spec_decode_misconfig"
    assert rc.text.startswith("AssertionError: Only EAGLE and DSPARK")  # the evidence is the exception
    assert "--speculative-num-steps" in rc.remedy and "--speculative-algorithm" in rc.remedy


def test_a_draft_checkpoint_the_draft_loader_cannot_read() -> None:
    # SafeAILab/EAGLE#130: KeyError in qwen2.py load_weights, called from EAGLEWorker
    rc = _root("126-spec_decode_misconfig.log")
    assert rc.label == "spec_decode_misconfig" and rc.text.startswith("KeyError:")
    assert rc.profile_key == "modes.<mode>.draft_model_path"
    assert any("sglang/srt/models/qwen2.py" in f for f in rc.frames)


def test_jit_build_failure_under_ray_prefixes_and_repeat_suffixes() -> None:
    # THUDM/slime#1314: flashinfer's ninja run failing inside (SGLangEngine pid=N) lines
    for lines in (raw_lines(CORPUS / "111-flashinfer_jit_error.log"),
                  as_journald(raw_lines(CORPUS / "111-flashinfer_jit_error.log"))):
        rc = classify(lines).root_cause
        assert rc is not None and rc.label == "flashinfer_jit_error"
        assert "[repeated" not in rc.text and rc.text.startswith("subprocess.CalledProcessError")


def test_triton_failure_named_by_the_compiler_frame() -> None:
    # sgl-project/sglang#1058: "IndexError: map::at" says nothing; triton's compiler raised it
    rc = _root("107-triton_compile_error.log")
    assert rc.label == "triton_compile_error" and rc.text == "IndexError: map::at"
    assert rc.frames and rc.frames[0].startswith("triton/backends/nvidia/compiler.py")


def test_a_cuda_driver_symbol_points_at_the_driver_not_the_library_path() -> None:
    rc = _root("117-cuda_driver_incompatible.log")
    assert rc.label == "cuda_driver_incompatible" and "driver" in rc.remedy.lower()
    lib = _root("131-cuda_lib_load.log")  # a cuda* runtime symbol: the runtime library is skewed
    assert lib.label == "cuda_lib_load"


def test_a_one_line_rocm_fault_is_not_healthy() -> None:
    assert _root("100-illegal_memory_access.log").label == "illegal_memory_access"
