"""Each class holds for the wordings its failure has in the source that raises it (issue 20).

Every line below is made up for the tests from a message string in the installed source (SGLang
0.5.23, torch, transformers 5, huggingface_hub, NCCL, CUDA), with plausible values in its
placeholders, the way a log shows it. None was captured from a server. Each row names where its
text comes from; taking out the pattern that reads it makes its row fail.
"""

from __future__ import annotations

import pytest

from ddtree_ops.diagnose.classify import classify

WORDINGS = [
    # ---- cuda_oom: the allocation failure at every layer that reports it
    ("RuntimeError: Triton Error [CUDA]: out of memory", "cuda_oom",
     "triton driver launch error (SGLang mem_cache/allocator/unified_sub_pool.py quotes it)"),
    ("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 9216.00 MiB on device 0: cudaMalloc failed: out of memory",
     "cuda_oom", "a CUDA runtime cudaMalloc failure as engines print it"),
    ("RuntimeError: cuDNN error: CUDNN_STATUS_ALLOC_FAILED", "cuda_oom", "cuDNN status enum"),
    ("ggml_gallocr_reserve_n: failed to allocate CUDA0 buffer of size 2147483648", "cuda_oom",
     "ggml/src/ggml-alloc.c (ggml_gallocr_reserve_n)"),
    ("alloc_tensor_range: failed to allocate ROCm0 buffer of size 4294967296", "cuda_oom",
     "ggml/src/ggml-alloc.c (alloc_tensor_range)"),
    # ---- host_oom: torch's host allocator says it itself
    ("RuntimeError: [enforce fail at alloc_cpu.cpp:114] data. DefaultCPUAllocator: not enough memory: you tried to "
     "allocate 1073741824 bytes.", "host_oom", "c10/core/impl/alloc_cpu.cpp"),
    ("RuntimeError: [enforce fail at CPUAllocator.cpp:64] . DefaultCPUAllocator: can't allocate memory: you tried to "
     "allocate 1073741824 bytes. Error code 12 (Cannot allocate memory)", "host_oom", "c10/core/CPUAllocator.cpp (torch 1.x)"),
    # ---- host_oom: Ray's memory monitor, whose exception is also named OutOfMemoryError
    ("ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.", "host_oom",
     "ray python/ray/exceptions.py (OutOfMemoryError)"),
    ("(raylet) [2025-01-01 00:00:00,000 E 123 123] (raylet) node_manager.cc:3069: 1 Workers (tasks / actors) killed "
     "due to memory pressure (OOM), 0 Workers crashed due to other reasons at node (ID: abc, IP: 10.0.0.1) over the "
     "last time period.", "host_oom", "ray src/ray/raylet/node_manager.cc"),
    # ---- unclassified_crash: vLLM's executor losing a worker, when nothing before it names why
    ("ERROR 06-07 22:53:03 [multiproc_executor.py:140] Worker proc VllmWorker-0 died unexpectedly, shutting down "
     "executor.", "unclassified_crash", "vllm/v1/executor/multiproc_executor.py"),
    # ---- nccl_error: other layers' words for an NCCL failure
    ("RuntimeError: NCCL Error 2: unhandled system error (run with NCCL_DEBUG=INFO for details)", "nccl_error",
     "torch/csrc/distributed/c10d/NCCLUtils.hpp (torch 1.x)"),
    ("transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer 10.0.0.2<43123> with status=12 opcode=0 "
     "len=0 vendor err 129 (Recv) localGid ::ffff:10.0.0.1", "nccl_error", "nccl src/transport/net_ib.cc"),
    ("NCCL WARN NET/IB : Got completion with error 12, opcode 0, len 0, vendor err 129", "nccl_error",
     "nccl src/transport/net_ib.cc (NCCL 2.1x)"),
    ("misc/socket.cc:484 NCCL WARN Bootstrap : no socket interface found", "nccl_error", "nccl src/bootstrap.cc"),
    ("transport/net_socket.cc:120 NCCL WARN NET/Socket : no interface found", "nccl_error", "nccl src/transport/net_socket.cc"),
    ("torch.distributed.DistNetworkError: The client socket has failed to connect to any network address of "
     "(10.0.0.1, 29500). The client socket has failed to connect to 10.0.0.1:29500 (errno: 113 - No route to host).",
     "nccl_error", "torch/csrc/distributed/c10d/socket.cpp (SocketConnectOp::run)"),
    ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer [10.0.0.2]:34567",
     "nccl_error", "gloo/transport/tcp/pair.cc (a peer of the CPU group went away)"),
    ("RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:144] Connect timeout [10.0.0.2]:22311",
     "nccl_error", "gloo/transport/tcp/pair.cc"),
    # ---- kv_pool_too_small: the pool cannot hold even one request at startup
    ("AssertionError: Memory pool size is too small", "kv_pool_too_small", "srt/managers/tp_worker.py"),
    ("RuntimeError: SWA pool cap (4096 tokens, 1.25 GiB) leaves no room for the full KV pool within the available "
     "0.80 GiB. Reduce --max-running-requests, lower SGLANG_SWA_EVICTION_INTERVAL, or increase --mem-fraction-static.",
     "kv_pool_too_small", "srt/model_executor/pool_configurator.py"),
    ("ValueError: SWA pool (4096 tokens) cannot hold even one request: the prefill admission floor is "
     "sliding_window_size (4096) + page_size (64). Increase --swa-full-tokens-ratio or the total KV budget.",
     "kv_pool_too_small", "srt/model_executor/pool_configurator.py (validate_swa_pool_size)"),
    ("ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that can be stored in "
     "KV cache (21024). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the "
     "engine.", "kv_pool_too_small", "vLLM worker (KV cache smaller than one sequence)"),
    # ---- hf_download_blocked: the Hub unreachable and nothing cached (transformers 5, huggingface_hub 1.x/2.x)
    ("OSError: We couldn't connect to 'https://hf-mirror.com' to load the files, and couldn't find them in the cached "
     "files.", "hf_download_blocked", "transformers/utils/hub.py (a mirror endpoint)"),
    ("huggingface_hub.errors.CachedRepoTreeNotFoundError: No cached tree listing found for 'Qwen/Qwen3-8B' (revision "
     "'main', commit 'a1b2c3', repo_type 'model') in '/root/.cache/huggingface/hub'.", "hf_download_blocked",
     "huggingface_hub/_snapshot_download.py"),
    ("huggingface_hub.errors.OfflineModeIsEnabled: Cannot reach https://huggingface.co/api/models/Qwen/Qwen3-8B: "
     "offline mode is enabled. To disable it, please unset the `HF_HUB_OFFLINE` environment variable.",
     "hf_download_blocked", "huggingface_hub/utils/_http.py"),
    ("ValueError: Cannot pass 'force_download=True' when offline mode is enabled.", "hf_download_blocked",
     "huggingface_hub/file_download.py (_raise_on_head_call_error)"),
    ("ValueError: We have no connection or you passed local_files_only, so force_download is not an accepted option.",
     "hf_download_blocked", "huggingface_hub/file_download.py (0.1x releases)"),
    ("ValueError: Connection error, and we cannot find the requested files in the cached path. Please try again or make "
     "sure your Internet connection is on.", "hf_download_blocked", "transformers/file_utils.py (4.x before the hub split)"),
    # ---- model_not_found
    ("OSError: /models/Qwen3-8B is not a local folder or a valid repository name on 'https://hf.co'.",
     "model_not_found", "transformers/utils/hub.py (transformers 5)"),
    ("OSError: meta-llama/Llama-3.1-8B-Instruct is a gated repository. Make sure to request access at "
     "https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct and pass a token having permission to this repo.",
     "model_not_found", "transformers/utils/hub.py (transformers 5)"),
    # ---- tokenizer_error
    ("ValueError: Tokenizer class 'Qwen3Tokenizer' specified in the tokenizer config was not found. The tokenizer "
     "may need to be converted or re-saved.", "tokenizer_error", "transformers/models/auto/tokenization_auto.py"),
    ("ValueError: Tokenizer class LlamaTokenizerFast is not currently imported.", "tokenizer_error",
     "transformers/models/auto/tokenization_auto.py"),
    ("ValueError: Unrecognized configuration class <class 'transformers_modules.x.configuration_x.XConfig'> to build "
     "an AutoTokenizer.", "tokenizer_error", "transformers/models/auto/tokenization_auto.py"),
    ("ValueError: No slow->fast converter found for GLMTokenizer and converting from Tiktoken failed.",
     "tokenizer_error", "transformers/convert_slow_tokenizer.py"),
    ("ValueError: `tiktoken` is required to read a `tiktoken` file. Install it with `pip install tiktoken`.",
     "tokenizer_error", "transformers/convert_slow_tokenizer.py"),
    # ---- nccl_error: the ranks' rendezvous never completed
    ("torch.distributed.DistStoreError: Timed out initializing process group in store based barrier on rank 1, for "
     "key: store_based_barrier_key:1 (world_size=2, num_workers_joined=1, timeout=0:30:00 error=)", "nccl_error",
     "torch/distributed/distributed_c10d.py"),
    ("torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError", "nccl_error",
     "torch/distributed/elastic/rendezvous/api.py"),
    ("torch.distributed.DistBackendError: [3] is setting up NCCL communicator and retrieving ncclUniqueId from [0] "
     "via c10d key-value store by key '0', but store->get('0') got error: Connection reset by peer", "nccl_error",
     "torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (broadcastUniqueNCCLID)"),
    ("RuntimeError: [1] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via c10d key-value store "
     "by key '0', but store->get('0') got error: Socket Timeout", "nccl_error",
     "torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (older torch raises it as RuntimeError)"),
    # ---- watchdog_timeout: torch's NCCL watchdog reporting the work that timed out
    ("[rank1]:[E1003 18:37:01.833621509 ProcessGroupNCCL.cpp:1709] [PG 0 (default_pg) Rank 1] Timeout at NCCL work: "
     "6463, last enqueued NCCL work: 6463, last completed NCCL work: 6462.", "watchdog_timeout",
     "torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (watchdog, timedOut)"),
    # ---- unclassified_crash: the watchdog's exit line alone names no cause, but it is a death
    ("[rank3]:[E321 02:07:08.465 ProcessGroupNCCL.cpp:627] [Rank 3] To avoid data inconsistency, we are taking the "
     "entire process down.", "unclassified_crash", "torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp"),
    # ---- bad_launch_flags (gpu visibility)
    ("RuntimeError: device 1 is not visible (CUDA_VISIBLE_DEVICES=0)", "bad_launch_flags", "torch/cuda/__init__.py"),
    # ---- flashinfer_jit_error: the JIT toolchain itself
    ("FileNotFoundError: nvcc not found at '/usr/local/cuda/bin/nvcc'. Ensure CUDA path '/usr/local/cuda' is correct.",
     "flashinfer_jit_error", "torch/utils/cpp_extension.py"),
    ("RuntimeError: The current installed version of g++ (14.2.0) is greater than the maximum required version by "
     "CUDA 12.4. Please make sure to use an adequate version of g++ (>=6.0.0, <14.0).", "flashinfer_jit_error",
     "torch/utils/cpp_extension.py"),
    ("subprocess.CalledProcessError: Command '['ninja', '-v']' returned non-zero exit status 1.",
     "flashinfer_jit_error", "torch/utils/cpp_extension.py (_run_ninja_build)"),
    # ---- triton_compile_error: Triton cannot build its launcher
    ("RuntimeError: Failed to find C compiler. Please specify via CC environment variable or set "
     "triton.knobs.build.impl.", "triton_compile_error", "triton/runtime/build.py"),
    # ---- unclassified_crash: the driver says the GPU stopped answering (issue 20, third round)
    ("NVRM: krcWatchdog_IMPL: RC watchdog: GPU is probably locked!  Notify Timeout Seconds: 7", "unclassified_crash",
     "NVIDIA open-gpu-kernel-modules src/nvidia/src/kernel/gpu/rc/kernel_rc_watchdog.c"),
    ("NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system has fallen off the bus and is "
     "not responding to commands.", "unclassified_crash", "NVIDIA driver os-interface (the GPU gone from PCIe)"),
    ("NVRM: GPU 0000:01:00.0: RmInitAdapter failed! (0x62:0x40:2028)", "unclassified_crash",
     "NVIDIA driver (adapter initialisation, kernel log)"),
    ("Unable to determine the device handle for GPU 0000:05:00.0: GPU is lost.  Reboot the system to recover this GPU",
     "unclassified_crash", "nvidia-smi / NVML (NVML_ERROR_GPU_IS_LOST)"),
    # ---- killed_by_signal: a launcher reporting its child's Popen.returncode, -N for signal N
    ("[2024-02-06 06:23:39,510] [ERROR] [launch.py:321:sigkill_handler] ['/usr/bin/python', '-u', 'train.py', "
     "'--local_rank=0'] exits with return code = -9", "killed_by_signal",
     "deepspeed/launcher/launch.py (sigkill_handler)"),
    ("CompletedProcess(args=['python3', '-m', 'sglang.launch_server'], returncode=-9)", "killed_by_signal",
     "CPython Lib/subprocess.py (CompletedProcess.__repr__)"),
    ("[2024-02-06 06:23:39,510] [ERROR] [launch.py:321:sigkill_handler] ['bash', 'run.sh'] exits with return code = 137",
     "killed_by_signal", "deepspeed/launcher/launch.py (a shell child: 128 + 9)"),
    # ---- spec_decode_misconfig: a draft checkpoint's weights that the loading class cannot place (vLLM's words)
    ("ValueError: There is no module or parameter named 'midlayer' in LlamaForCausalLM", "spec_decode_misconfig",
     "vllm/model_executor/models/utils.py (AutoWeightsLoader._load_module; EAGLE3's midlayer)"),
    ("ValueError: There is no module or parameter named 'medusa_head' in Medusa", "spec_decode_misconfig",
     "vllm/model_executor/models/utils.py (a draft class names the draft: vllm/model_executor/models/medusa.py)"),
    ("ValueError: Following weights were not initialized from checkpoint: {'model.fc.weight'}", "spec_decode_misconfig",
     "vllm/model_executor/model_loader/default_loader.py (EAGLE's fc)"),
    # ... and not when only a base weight is named: nothing says the checkpoint is a draft
    ("ValueError: There is no module or parameter named 'embed_tokens' in LlamaForCausalLM", "unclassified_crash",
     "vllm/model_executor/models/utils.py (a bare LlamaModel checkpoint fails the same way)"),
    # ---- native_abort: every fatal signal CPython's faulthandler names (Modules/faulthandler.c)
    ("Fatal Python error: Bus error", "native_abort", "CPython Modules/faulthandler.c (SIGBUS)"),
    ("Fatal Python error: Illegal instruction", "native_abort", "CPython Modules/faulthandler.c (SIGILL)"),
    ("Fatal Python error: Floating point exception", "native_abort", "CPython Modules/faulthandler.c (SIGFPE)"),
    ("*** SIGFPE received at time=1767000000 on cpu 3 ***", "native_abort", "abseil failure_signal_handler.cc"),
    ("terminate called without an active exception", "native_abort", "libstdc++ (std::terminate, no exception)"),
    ("libc++abi: terminating due to uncaught exception of type std::runtime_error: vector", "native_abort",
     "libc++abi (uncaught exception)"),
    ("/app/ggml/src/ggml.c:1738: GGML_ASSERT(ggml_nelements(a) == ne0*ne1) failed", "native_abort",
     "ggml/src/ggml.c (ggml_abort under GGML_ASSERT)"),
    ("/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu:75: CUDA error", "native_abort",
     "ggml/src/ggml-cuda/ggml-cuda.cu (ggml_cuda_error aborts)"),
    # ---- bad_launch_flags: llama.cpp's own argument parser (common/arg.cpp)
    ("error: invalid argument: --max-loaded-loras", "bad_launch_flags", "llama.cpp common/arg.cpp"),
    ('error while handling argument "--flash-attn": expected value for argument', "bad_launch_flags",
     "llama.cpp common/arg.cpp"),
    # ---- unclassified_crash: vLLM's engine process giving up, when nothing before it names why
    ("ERROR 06-07 22:53:03 [core.py:700] EngineCore failed to start.", "unclassified_crash", "vllm/v1/engine/core.py"),
    # ---- port_bind_error: llama.cpp's server names no errno
    ("main: couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 8080", "port_bind_error",
     "llama.cpp tools/server/server.cpp"),
    # ---- bad_launch_flags (gpu visibility): the CUDA runtime finds no device at all
    ("RuntimeError: CUDA error: no CUDA-capable device is detected", "bad_launch_flags", "CUDA runtime (cudaErrorNoDevice)"),
    ("ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device is detected", "bad_launch_flags",
     "ggml/src/ggml-cuda/ggml-cuda.cu (ggml_cuda_init)"),
    # ---- spec_decode_misconfig: llama.cpp refusing the draft for its target
    ("srv    load_model: the draft model '/models/qwen3-0.6b.gguf' is not compatible with the target model "
     "'/models/llama3-8b.gguf'", "spec_decode_misconfig", "llama.cpp tools/server/server.cpp"),
    ("common_speculative_are_compatible: draft vocab vocab must match target vocab to use speculation but token 151643 "
     "content differs - target '<|endoftext|>', draft '<|im_end|>'", "spec_decode_misconfig",
     "llama.cpp common/speculative.cpp"),
    ("common_speculative_are_compatible: draft model vocab must closely match target model to use speculation but "
     "target vocab size 151936 does not match draft vocab size 32000 - difference 119936, max allowed 128",
     "spec_decode_misconfig", "llama.cpp common/speculative.cpp"),
    # ---- unclassified_crash: a Rust panic no rule names (Rust-based servers and routers)
    ("thread 'main' panicked at router/src/main.rs:110:10:", "unclassified_crash", "Rust std panicking.rs (1.73+)"),
    ("thread 'tokio-runtime-worker' panicked at 'called `Option::unwrap()` on a `None` value', src/lib.rs:42:9",
     "unclassified_crash", "Rust std panicking.rs (before 1.73)"),
    # ---- cuda_graph_capture: every error of the CUDA runtime's stream-capture family, as torch raises it
    ("RuntimeError: CUDA error: capturing stream has unjoined work", "cuda_graph_capture",
     "CUDA runtime cudaErrorStreamCaptureUnjoined (torch c10/cuda CUDA error)"),
    ("RuntimeError: CUDA error: operation would make the legacy stream depend on a capturing blocking stream",
     "cuda_graph_capture", "CUDA runtime cudaErrorStreamCaptureImplicit"),
    ("RuntimeError: CUDA error: operation not permitted on an event last recorded in a capturing stream",
     "cuda_graph_capture", "CUDA runtime cudaErrorCapturedEvent"),
    # ---- triton_compile_error: Triton 3's MLIR pass pipeline failing on a kernel
    ("/usr/lib/python3/dist-packages/sglang/srt/layers/attention/triton_ops/extend_attention.py:98:0: error: Failures "
     "have been detected while processing an MLIR pass pipeline", "triton_compile_error",
     "MLIR PassManager (Triton 3 make_ttgir / make_llir)"),
    ("/usr/lib/python3/dist-packages/sglang/srt/layers/attention/triton_ops/extend_attention.py:98:0: note: Pipeline "
     "failed while executing [`ConvertTritonGPUToLLVM` on 'builtin.module' operation]", "triton_compile_error",
     "MLIR PassManager's note naming the Triton pass"),
    # ---- kernel_op_missing: the engine imports or looks up an op its kernel package lacks
    ("ImportError: cannot import name 'fp8_blockwise_scaled_mm' from 'sgl_kernel.gemm' "
     "(/usr/lib/python3/dist-packages/sgl_kernel/gemm.py)", "kernel_op_missing",
     "CPython import of a name an older sgl-kernel module lacks (SGLang layers/quantization imports)"),
    ("AttributeError: module 'vllm._C' has no attribute 'gptq_marlin_repack'", "kernel_op_missing",
     "CPython attribute lookup on vllm's compiled _C module"),
    # ---- a fatal signature inside a Python warning is still its cause (benign rules come after causes)
    ("/usr/lib/python3/dist-packages/torch/cuda/__init__.py:129: UserWarning: CUDA initialization: The NVIDIA driver "
     "on your system is too old (found version 11040).", "cuda_driver_incompatible", "torch/cuda/__init__.py"),
]

# Lines that are harmless by what they are: reported as harmless, never a root cause.
HARMLESS = [
    # Python's warnings: any category, standard or a library's own, in warnings.py's FILE:LINE form
    ("/usr/lib/python3/dist-packages/torch/_utils.py:831: UserWarning: TypedStorage is deprecated. It will be removed "
     "in the future and UntypedStorage will be the only storage class.", "torch/storage.py (_warn_typed_storage_removal)"),
    ("/app/model.py:12: TracerWarning: Converting a tensor to a Python boolean might cause the trace to be incorrect.",
     "torch/jit/_trace.py (TracerWarning, a library's own category)"),
    ("/usr/lib/python3.12/multiprocessing/popen_fork.py:66: RuntimeWarning: os.fork() was called. os.fork() is "
     "incompatible with multithreaded code, and JAX is multithreaded, so this will likely lead to a deadlock.",
     "jax (os.register_at_fork RuntimeWarning)"),
    ("<frozen importlib._bootstrap>:488: DeprecationWarning: builtin type SwigPyPacked has no __module__ attribute",
     "SWIG-built modules (faiss, sentencepiece) under CPython 3.12: a frozen frame, no FILE.py"),
    # lines that say of themselves that they are normal
    ("E llama_init_from_model: failed to initialize the context: Gemma4Assistant requires ctx_other to be set (this "
     "warning is normal during memory fitting)", "llama.cpp src/llama-context.cpp"),
    ("[2026-01-10 09:00:00 TP0] NVLink detection failed. This is normal if your machine has no NVLink equipped.",
     "SGLang srt/distributed/device_communicators/custom_all_reduce_utils.py"),
    ("name_or_path not provided, will work for all GPTSw3 models except gpt-sw3-7b, you are testing the model, this "
     "can safely be ignored", "transformers/models/gpt_sw3/tokenization_gpt_sw3.py"),
    # SGLang switching its custom all-reduce off for this topology, in each wording of its checks
    ("[2026-01-10 09:00:04 TP0] CustomAllreduce is disabled because your platform lacks GPU P2P capability or P2P "
     "test failed. To silence this warning, specify disable_custom_all_reduce=True explicitly.",
     "SGLang srt/distributed/device_communicators/custom_all_reduce_utils.py (cls_name CustomAllreduce)"),
    ("[2026-01-10 09:00:04 TP0] CustomAllReduceV2 is disabled due to an unsupported world size: 6. Supported world "
     "sizes: [2, 4, 6, 8].", "SGLang custom_all_reduce_utils.py (cls_name CustomAllReduceV2)"),
    ("[2026-01-10 09:00:04 TP0] Custom quick allreduce is disabled because this process group spans across nodes.",
     "SGLang srt/distributed/device_communicators/quick_all_reduce.py"),
    # vLLM turning a CUDA-only feature off on another platform
    ("WARNING 10-23 18:38:47 [cpu.py:316] Pin memory is not supported on CPU.", "vllm/platforms/cpu.py"),
    ("WARNING 03-01 10:00:00 [utils.py:700] Using 'pin_memory=False' as WSL is detected. This may slow down the "
     "performance.", "vllm/utils (is_pin_memory_available)"),
    ("INFO 06-07 22:53:02 [importing.py:46] Triton is installed but 0 active driver(s) found (expected 1). Disabling "
     "Triton to prevent runtime errors.", "vllm/triton_utils/importing.py"),
]


@pytest.mark.parametrize("line, label, source", WORDINGS, ids=[f"{w[1]}:{w[0][:40]}" for w in WORDINGS])
def test_a_wording_from_the_source_names_its_class(line: str, label: str, source: str) -> None:
    rep = classify([line])
    assert rep.root_cause is not None and rep.root_cause.label == label, (source, rep.root_cause)


@pytest.mark.parametrize("line, source", HARMLESS, ids=[h[0][:50] for h in HARMLESS])
def test_a_harmless_line_is_reported_harmless(line: str, source: str) -> None:
    rep = classify([line])
    # no failure; alone, the line shows no server that served either: inconclusive, never failed
    assert rep.root_cause is None and rep.verdict == "inconclusive", (source, rep.root_cause)
    assert [f.severity for f in rep.findings] == ["benign"], (source, rep.findings)
