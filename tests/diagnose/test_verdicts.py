"""Verdicts an operator (and the deploy gate) acts on (issue 20): a benign phrase never silences a
failure, a SIGKILL is not called host OOM without the OOM killer's word, a generic message gets a
specific cause only from the log's own context, and a remedy names the profile key to change."""

from __future__ import annotations

from ddtree_ops.diagnose.classify import classify
from diagnose_helpers import CORPUS, FIXTURES, REPO, raw_lines

REAL = REPO / "tests" / "data" / "real-sglang" / "0.5.17"


def _root(lines: list[str] | list[bytes]):  # noqa: ANN202 - a Finding
    rc = classify(lines).root_cause
    assert rc is not None
    return rc


# ------------------------------------------------------------------ benign phrases never outrank a failure


def test_a_benign_phrase_on_a_fatal_line_does_not_silence_it() -> None:
    """A line can say it is harmless and still carry a failure's signature: the failure counts."""
    for line in ("[2026-01-10 09:00:12 TP0] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
                 "This is expected.",
                 "[2026-01-10 09:00:12 TP0] The client socket has failed to connect to [::1]:29500 (errno: 99 - "
                 "Cannot assign requested address). RuntimeError: CUDA error: an illegal memory access was encountered"):
        rep = classify([line])
        assert rep.verdict == "failed" and rep.root_cause is not None, line
    assert _root([b"RuntimeError: CUDA out of memory. This is expected"]).label == "cuda_oom"


def test_a_benign_line_before_a_failure_does_not_silence_the_later_lines() -> None:
    lines = ["[2026-01-10 09:00:06 TP0] Using default MoE kernel config. Performance might be sub-optimal! Config file "
             "not found at /opt/venv/.../E=128,N=768.json",
             "[2026-01-10 09:00:07 TP0] Scheduler hit an exception: Traceback (most recent call last):",
             '  File "/opt/venv/lib/python3.11/site-packages/sglang/srt/managers/scheduler.py", line 6350, in run_scheduler_process',
             "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB"]
    rc = _root(lines)
    assert rc.label == "cuda_oom" and rc.line == 4


def test_a_rejected_request_is_harmless_not_an_unnamed_crash() -> None:
    """Benign rules still outrank the generic evidence (an exception line no rule names)."""
    rep = classify(["ValueError: The input (40210 tokens) is longer than the model's context length (32768 tokens)."])
    assert rep.root_cause is None and [f.severity for f in rep.findings] == ["benign"]
    assert rep.verdict == "inconclusive"  # a rejected request alone does not show the server served


# ------------------------------------------------------------------ SIGKILL is not host OOM by itself


def test_a_scheduler_killed_by_hand_is_killed_by_signal() -> None:
    """Real 0.5.17: the runner SIGKILLed the scheduler; nothing in the log names an OOM killer."""
    rc = _root(raw_lines(REAL / "4_crash_after_ready.log"))
    assert rc.label == "killed_by_signal" and "exit code -9" in rc.text
    assert "journalctl -k" in rc.remedy and "TimeoutStopSec" in rc.remedy and "host_oom" in rc.remedy


def test_the_oom_killers_word_makes_a_sigkill_host_oom() -> None:
    kill = "[2026-12-01 22:35:21] Subprocess scheduler_0 (pid=2137) crashed with exit code -9. Triggering SIGQUIT for cleanup..."
    oom = "Dec 01 22:35:20 h200 kernel: Out of memory: Killed process 2137 (python) total-vm:78521468kB, anon-rss:60123456kB"
    assert _root([kill]).label == "killed_by_signal"
    assert _root([oom, kill]).label == "host_oom"
    assert _root([kill, oom]).label == "host_oom"  # the kernel's line may be written after SGLang's
    systemd = raw_lines(FIXTURES / "synthetic-host_oom-systemd.log")
    assert _root(systemd).label == "host_oom"
    assert _root([ln for ln in systemd if b"OOM killer" not in ln and b"oom-kill" not in ln]).label == "killed_by_signal"


def test_the_first_unexplained_death_or_crash_in_time_is_the_root() -> None:
    """A kill, then the launcher's traceback (logcorpus 505, 522): the kill. An unnamed crash, then
    SGLang killing the rest: the crash. A kill, then the other ranks' NCCL errors: the kill."""
    kill = "[12-16 14:27:10] Exit code: -9"
    tb = ["Traceback (most recent call last):",
          '  File "/x/sglang/multimodal_gen/runtime/launch_server.py", line 98, in launch_server',
          "    raise RuntimeError(msg)",
          "RuntimeError: launch failed"]
    assert _root([kill, *tb]).label == "killed_by_signal"
    assert _root([*tb, "[2026-12-01 22:35:21] Subprocess detokenizer (pid=2) crashed with exit code -9."]).label \
        == "unclassified_crash"
    nccl = "[rank1]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:3763, remote process exited"
    assert _root([kill, nccl]).label == "killed_by_signal"
    assert _root([nccl, kill]).label == "nccl_error"


def test_a_sigkill_in_each_layers_words_is_killed_by_signal() -> None:
    """The same death as multiprocessing, subprocess, a shell, a container, systemd and Go say it."""
    for line in ("RuntimeError: Rank 0 scheduler died during initialization (exit code: -9). If exit code is -9 (SIGKILL), "
                 "a common cause is the OS OOM killer.",                                          # SGLang 0.5.23 engine.py
                 "RuntimeError: scheduler_0 exited during initialization (exit code -9). Check the worker logs.",
                 "<SpawnProcess name='SpawnProcess-1' pid=4242 parent=4200 stopped exitcode=-SIGKILL>",  # multiprocessing repr
                 "subprocess.CalledProcessError: Command '['python3', '-m', 'sglang.launch_server']' died with "
                 "<Signals.SIGKILL: 9>.",                                                         # subprocess
                 "sglang-1 exited with code 137",                                                 # docker compose
                 "Error: llama runner process has terminated: signal: killed"):                   # Go os/exec
        rc = _root([line])
        assert rc.label == "killed_by_signal", line


# ------------------------------------------------------------------ generic messages need context


def test_this_should_not_happen_is_named_only_from_a_plugin_algorithm() -> None:
    lines = raw_lines(REAL / "1_neg_nonfamily_graph_layers13.log")
    rc = _root(lines)
    assert rc.label == "hidden_capture_missing" and "speculative_algorithm='DDTREE'" in rc.context
    assert "decode_cuda_graph_runner.py" in rc.context
    # the same traceback under SGLang's own DFLASH says nothing specific: the backstop names it
    dflash = [ln.replace(b"speculative_algorithm='DDTREE'", b"speculative_algorithm='DFLASH'") for ln in lines
              if b"DDTREE shadow" not in ln and b"negctl" not in ln]
    rc = _root(dflash)
    assert rc.label == "unclassified_crash" and rc.text == "RuntimeError: This should not happen"


def test_a_registered_ddtree_is_not_missing_its_capture() -> None:
    """The plugin's registration line is the context that tells the two causes of a feature-dim
    mismatch apart: with it, the draft's target_layer_ids are at fault."""
    lines = [ln for ln in raw_lines(REAL / "2_neg_nonfamily_nograph.log") if b"negctl" not in ln]
    assert _root(lines).label == "hidden_capture_missing"
    registered = [b"[2026-12-01 17:56:07] DDTREE registered as DFlash-family, hidden capture layers [1, 3]", *lines]
    rc = _root(registered)
    assert rc.label == "spec_decode_misconfig" and "target_layer_ids" in rc.remedy


def test_secondary_symptoms_say_what_they_add() -> None:
    """py-spy missing beside a watchdog, sgl_kernel's banner without its details: each is reported
    with its own remedy (and the banner names the ABI problem when nothing else does)."""
    rep = classify(raw_lines(CORPUS / "012-watchdog_timeout.log"))
    assert any(f.severity == "warning" and "py-spy" in f.remedy for f in rep.findings)
    banner = [ln for ln in raw_lines(CORPUS / "005-abi_mismatch.log") if b"undefined symbol" not in ln]
    rc = _root(banner)
    assert rc.label == "abi_mismatch" and "common_ops" in rc.text and "sgl-kernel" in rc.remedy


# ------------------------------------------------------------------ remedies that name the setting


def test_context_past_the_models_limit_names_the_key_and_a_value_that_works() -> None:
    rc = _root(raw_lines(FIXTURES / "synthetic-bad_launch_flags-context-past-model-max.log"))
    assert rc.profile_key == "memory.context_length" and rc.direction == "lower"
    assert "from 65536 to 4096" in rc.remedy
    draft = ["ValueError: Warning: Target model's context_length (32768) is greater than the derived context_length "
             "(2048). This may lead to incorrect model outputs or CUDA errors."]
    rc = _root(draft)
    assert "draft_model_path" in rc.meaning + rc.remedy and "from 32768 to 2048" in rc.remedy


def test_a_longer_context_the_operator_allowed_is_not_a_failure() -> None:
    """SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1: SGLang logs the same sentence as a warning and
    serves (the lab's ct200 profile and its baseline set it); only the raised ValueError is fatal."""
    allowed = ["[2026-12-02 06:14:51] Warning: User-specified context_length (65536) is greater than the derived "
               "context_length (40960). This may lead to incorrect model outputs or CUDA errors. Note that the "
               "derived context_length may differ from max_position_embeddings in the model's config.",
               "[2026-12-02 06:14:58] The server is fired up and ready to roll!"]
    rep = classify(allowed)
    assert rep.root_cause is None and rep.verdict == "healthy", rep.root_cause
    refused = ["ValueError: " + allowed[0].split("] ", 1)[1] + " To allow overriding this maximum, set the env var "
               "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"]
    assert _root(refused).label == "bad_launch_flags"


def test_gpu_visibility_names_the_cards_and_the_keys() -> None:
    rc = _root(raw_lines(FIXTURES / "synthetic-bad_launch_flags-invalid-ordinal-tp2.log"))
    assert rc.label == "bad_launch_flags" and rc.profile_key == "gpus"
    assert "tp_size=2" in rc.context and "CUDA_VISIBLE_DEVICES=0,1" in rc.context
    assert "parallel.tp_size" in rc.remedy and "nvidia-smi -L" in rc.remedy
    rc = _root(raw_lines(FIXTURES / "synthetic-bad_launch_flags-no-accelerator-gpus-1.log"))
    assert rc.profile_key == "gpus" and "gpus" in rc.remedy and "nvidia-smi -L" in rc.remedy


def test_a_refused_argument_names_its_profile_key() -> None:
    rc = _root(["launch_server.py: error: argument --attention-backend: invalid choice: 'flashinfer2' "
                "(choose from 'flashinfer', 'triton', 'fa3', 'fa4')"])
    assert rc.label == "bad_launch_flags" and "memory.attention_backend" in rc.remedy
    rc = _root(raw_lines(FIXTURES / "synthetic-bad_launch_flags-unrecognized.log"))
    assert "launch_server --help" in rc.remedy  # a flag no profile key renders: the generic advice


def test_the_speculative_machinery_named_in_an_exception_is_spec_decode_misconfig() -> None:
    """SGLang 0.5.23's speculative workers, draft pools and model hooks refuse what they cannot run,
    naming the draft or the algorithm's parts; a one-line quote without frames is named from that.
    A specific cause that only mentions the draft (its repo not found, its OOM) keeps its own label."""
    for line in ("ValueError: DFLASH with a quantized target lm_head is only supported at tp=1, got tp_size=2.",
                 "NotImplementedError: CPU offloading is unsupported for fused draft KV.",
                 "ValueError: EAGLE3 currently only supports 1 layer",
                 "AssertionError: MTP Topk > 1 not supported for DeepSeek V4"):
        assert _root([line]).label == "spec_decode_misconfig", line
    rc = _root(["RuntimeError: DFLASH draft model returned no hidden states."])
    assert rc.label == "hidden_capture_missing"
    for line, label in (
            ("huggingface_hub.errors.RepositoryNotFoundError: 404 Client Error. Repository Not Found for url: "
             "https://huggingface.co/api/models/yuhuili/EAGLE3-LLaMA3.1-Instruct-8B/revision/main.", "model_not_found"),
            ("torch.OutOfMemoryError: CUDA out of memory while loading the draft model. Tried to allocate 2.00 GiB.",
             "cuda_oom")):
        assert _root([line]).label == label, line


def test_a_refused_flag_in_a_quoted_exception_names_its_profile_key() -> None:
    """SGLang's argument hooks refuse flags by name; a one-line quote (no frames) still names the key."""
    rc = _root(raw_lines(FIXTURES / "synthetic-bad_launch_flags-flag-combination-excerpt.log"))
    assert rc.label == "bad_launch_flags" and "parallel.dp_size" in rc.remedy and "--dp-size 2" in rc.remedy
    # a flag that only appears as a hint in another cause's message does not make it a launch-flag problem
    rc = _root(["RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
                "Current value: mem_fraction_static=0.3"])
    assert rc.label == "kv_pool_too_small"


def test_a_cause_in_the_draft_names_the_draft_and_what_differs() -> None:
    rc = _root(raw_lines(FIXTURES / "synthetic-spec_decode_misconfig-dflash-hidden-mismatch.log"))
    assert rc.profile_key == "modes.<mode>.draft_model_path" and "512" in rc.remedy and "256" in rc.remedy
    assert "hidden_size" in rc.remedy and "models/dflash.py" in rc.context
    rc = _root(raw_lines(FIXTURES / "synthetic-spec_decode_misconfig-eagle3-draft-plain-class.log"))
    assert rc.profile_key == "modes.<mode>.draft_model_path" and "midlayer" in rc.remedy and "EAGLE3" in rc.remedy


def test_a_refused_gpu_generation_names_the_backend_setting() -> None:
    rc = _root(raw_lines(FIXTURES / "synthetic-unsupported_gpu_arch-fa3-on-blackwell.log"))
    assert rc.profile_key == "memory.attention_backend" and "fa3" in rc.meaning and "Blackwell" in rc.meaning
    rc = _root(raw_lines(FIXTURES / "synthetic-unsupported_gpu_arch-compute-capability.log"))
    assert rc.profile_key == "service.python" and "12.0" in rc.meaning
    # a flag refused for the GPU generation is the generation's problem, not the flag's spelling
    rc = _root(["ValueError: --quantization nvfp4_online is supported only on NVIDIA Blackwell SM100/SM103 GPUs."])
    assert rc.label == "unsupported_gpu_arch"


# ------------------------------------------------------------------ distributed failures in torch's own words


def test_process_group_failures_in_torchs_words() -> None:
    """torch c10d: a monitored barrier a rank never reached is a hang (watchdog_timeout); an
    aborted communicator or a barrier that got another rank's error is an NCCL/process-group
    failure, which yields to an earlier unexplained crash (the faulty rank's own error)."""
    for line, label in (
            ("RuntimeError: Rank 0 timed out in monitoredBarrier after 30000 ms.", "watchdog_timeout"),
            ("RuntimeError: Ranks 1, 3 failed to pass monitoredBarrier in 1800000 ms", "watchdog_timeout"),
            ("RuntimeError: NCCL communicator was aborted on rank 2.", "nccl_error"),
            ("[rank3]:[E421 04:13:43.426633564 ProcessGroupGloo.cpp:143] Rank 3 successfully reached monitoredBarrier, "
             "but received errors while waiting for send/recv from rank 0. Please check rank 0 logs for faulty rank.",
             "nccl_error")):
        assert _root([line]).label == label, line
