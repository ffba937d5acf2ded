"""What SGLang 0.5.17 prints, as data: the fixed texts, the capture lists and the traceback frames the
stand-in reproduces (stdlib only).

Taken from real SGLang 0.5.17 on an NVIDIA H200 (the logs in tests/data/real-sglang/0.5.17; the log
each text comes from is named beside it) or, where no real log shows a scenario, from the 0.5.17
source (marked "source"). Log strings are data; no SGLang code is copied. Traceback frames are the
ones 0.5.17 printed: under the host's own sglang directory their line numbers are 0.5.17's, not
those of the sglang the host has installed (0.5.23 in the lab).
"""

from __future__ import annotations

SGLANG_RELEASE = "0.5.17"
LAUNCH_SERVER_WARNING_LINE = 56  # every log: launch_server.py:56: UserWarning

# ---------------------------------------------------------------- launcher (every log)
MULTIMODAL_TRANSPORT = (
    "Multimodal feature transport auto-resolved to cuda_ipc (single-node CUDA). Pass --mm-feature-transport=cpu to "
    "opt out.",
    "Using CUDA IPC for multimodal features: reserving up to 1024 MiB on base GPU 0 across 1 tokenizer worker(s). "
    "This reduces KV cache headroom; a full pool falls back to CPU transport.",
    "CUDA IPC pool-handle caching is enabled. It reuses mappings to the existing bounded pool without reserving "
    "another pool; set SGLANG_USE_IPC_POOL_HANDLE_CACHE=0 to disable it.",
)
MAX_RUNNING_RESET = ("Max running requests is reset to 48 for speculative decoding. You can override this by "
                     "explicitly setting --max-running-requests.")  # 1_dflash_layers13 and every DFlash run
CHAT_TEMPLATE = "Using default HuggingFace chat template with detected content format: string"

# ---------------------------------------------------------------- CUDA graphs (1_base_graph, 2_dflash)
# cuda_graph_config as 0.5.17 resolves it (the server_args line of 1_base_nograph, 2_neg_nonfamily_nograph)
DECODE_BS = (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128, 136, 144, 152, 160, 168,
             176, 184, 192, 200, 208, 216, 224, 232, 240, 248, 256)
SPEC_DECODE_BS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 40, 44, 48, 52, 56, 60, 64,
                  72, 80, 88, 96, 104, 112, 120, 128, 136, 144, 152, 160, 168, 176, 184, 192, 200, 208, 216, 224, 232,
                  240, 248, 256)
PREFILL_NUM_TOKENS = (4, 8, 12, 16, 20, 24, 28, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256,
                      288, 320, 352, 384, 416, 448, 480, 512, 576, 640, 704, 768, 832, 896, 960, 1024, 1280, 1536,
                      1792, 2048, 2304, 2560, 2816, 3072, 3328, 3584, 3840, 4096, 4608, 5120, 5632, 6144, 6656, 7168,
                      7680, 8192)
PREFILL_GRAPH_DISABLED = ("Disable prefill CUDA graph because cuda_graph_config resolved prefill.backend='disabled' "
                          "(e.g. via --cuda-graph-backend-prefill=disabled or auto-disable rules).")
DRAFT_HEAD_FOLDED = "DFLASH draft greedy head folded into the draft cuda graph (tp=1)."  # 2_dflash
GRAPH_TIMING_PHASES = ("prefill", "decode", "target_verify", "draft_prefill", "draft_decode", "draft_extend")
TREE_CACHE = ("Tree cache initialized: source=default impl=RadixCache hybrid_swa=False hybrid_ssm=False "
              "hierarchical=False streaming_wrapped=False")
READY = "The server is fired up and ready to roll!"
WARMUP_PROMPT = "The capital city of France is"  # source: the warmup request the launcher sends itself

# ---------------------------------------------------------------- shutdown and crash handling
SIGTERM_RECEIVED = "SIGTERM received. signum=None frame=None. Draining requests and shutting down..."
SUBPROCESS_CRASHED = "Subprocess {name} (pid={pid}) crashed with exit code {code}. Triggering SIGQUIT for cleanup..."
SIGQUIT_RUNNING = "SIGQUIT received. signum=None, frame=None. It usually means one child failed."
SIGQUIT_LAUNCH = "Received sigquit from a child process. It usually means the child failed."
SLEEPING = "Sleeping 5 seconds before crash diagnostics to let GPU activity settle."
NO_LIVE_SCHEDULER = "No live scheduler processes found; skipping py-spy and CUDA coredump."
GRACEFUL = "Gracefully exiting... Remaining number of requests {n}. Remaining requests remaining_rids={rids!r}."
HEALTH_DURING_SHUTDOWN = "Health check request received during shutdown. Returning 503."  # source
KILL_TREE = "kill_process_tree called: parent_pid={pid}, include_parent={include}, pid={pid}"
# printed by torch in the scheduler process when it exits without destroy_process_group (2_dflash)
NCCL_NOT_DESTROYED = ("[rank0]:[W{stamp} ProcessGroupNCCL.cpp:1575] Warning: WARNING: destroy_process_group() was not "
                      "called before program exit, which can leak resources. For more info, please see "
                      "https://pytorch.org/docs/stable/distributed.html#shutdown (function operator())")

# ---------------------------------------------------------------- failures
DIM_MISMATCH = ("DFLASH target_hidden feature dim mismatch. Expected shape [N, {expected}] "
                "(num_context_features={features}, hidden_size={hidden}), but got shape=({tokens}, {got}). This "
                "usually means the target model is capturing a different number of layer features than the draft "
                "checkpoint/config expects.")  # 1_dflash_layers13, 2_neg_nonfamily_nograph
DRAFT_GRAPH_ERROR = "This should not happen"  # 1_neg_nonfamily_graph_layers13
GRAPH_TYPE_ERROR = "unsupported operand type(s) for *: 'int' and 'NoneType'"  # 2_neg_plain_graph
NOT_ENOUGH_MEMORY = "Not enough memory. Please try to increase --mem-fraction-static."  # source: pool_configurator.py
# source: 0.5.17 kv_cache_configurator.py _profile_available_bytes, when the weights leave no rest
# (real: tests/data/real-sglang/0.5.17/4_kv_too_small.log)
WEIGHTS_LEAVE_NO_KV = ("Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static={mfs}. "
                       "Raise --mem-fraction-static above {suggested} (minimum viable = 1 - available/pre = "
                       "{minimum:.4f}). If using speculative decoding, draft weights are now counted.")
CAPTURE_FAILED_HINT = ("Possible solutions:\n1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
                       "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n"
                       "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. (Not recommended. Huge "
                       "performance loss)\nOpen an issue on GitHub https://github.com/sgl-project/sglang/issues/new/"
                       "choose \n")  # source: runner_backend_utils

# Traceback bodies ("{sglang}" is the sglang package directory, "{torch}" torch's). The scheduler's
# event loop down to the worker's forward: 1_dflash_layers13 (identical in 1_ddtree_layers13 and
# 2_neg_nonfamily_nograph).
TB_EVENT_LOOP = '''\
  File "{sglang}/srt/managers/scheduler.py", line 4947, in run_scheduler_process
    scheduler.run_event_loop()
  File "{sglang}/srt/managers/scheduler.py", line 1662, in run_event_loop
    dispatch_event_loop(self)
  File "{sglang}/srt/managers/scheduler.py", line 4795, in dispatch_event_loop
    scheduler.event_loop_overlap()
  File "{torch}/utils/_contextlib.py", line 124, in decorate_context
    return func(*args, **kwargs)
           ^^^^^^^^^^^^^^^^^^^^^
  File "{sglang}/srt/managers/scheduler.py", line 1763, in event_loop_overlap
    batch_result = self.run_batch(batch)
                   ^^^^^^^^^^^^^^^^^^^^^
  File "{sglang}/srt/utils/nvtx_utils.py", line 109, in wrapper
    return func(*args, **kwargs)
           ^^^^^^^^^^^^^^^^^^^^^
  File "{sglang}/srt/managers/scheduler.py", line 3594, in run_batch
    batch_result = self.model_worker.forward_batch_generation(
                   ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
'''
TB_DIM_MISMATCH = '''\
  File "{sglang}/srt/speculative/dflash_worker_v2.py", line 1436, in forward_batch_generation
    self._append_target_hidden_to_draft_kv_by_loc(
  File "{sglang}/srt/speculative/dflash_worker_v2.py", line 1103, in _append_target_hidden_to_draft_kv_by_loc
    ctx_hidden = self.draft_model.project_target_hidden(target_hidden)
                 ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "{sglang}/srt/models/dflash.py", line 392, in project_target_hidden
    raise ValueError(
'''
TB_SCHEDULER_INIT = '''\
  File "{sglang}/srt/managers/scheduler.py", line 4931, in run_scheduler_process
    scheduler = Scheduler(
                ^^^^^^^^^^
  File "{sglang}/srt/managers/scheduler.py", line 498, in __init__
    self.init_model_worker()
'''
# 1_neg_nonfamily_graph_layers13
TB_DRAFT_GRAPH = '''\
  File "{sglang}/srt/managers/scheduler.py", line 985, in init_model_worker
    self.init_all_cuda_graphs()
  File "{sglang}/srt/managers/scheduler.py", line 972, in init_all_cuda_graphs
    self.draft_worker.init_cuda_graphs()
  File "{sglang}/srt/speculative/dflash_worker_v2.py", line 361, in init_cuda_graphs
    self._draft_worker.init_cuda_graphs(
  File "{sglang}/srt/managers/tp_worker.py", line 423, in init_cuda_graphs
    self.model_runner.init_cuda_graphs(
  File "{sglang}/srt/model_executor/model_runner.py", line 944, in init_cuda_graphs
    capture = capture_cuda_graphs(
              ^^^^^^^^^^^^^^^^^^^^
  File "{sglang}/srt/model_executor/model_runner_components/cuda_graph_setup.py", line 144, in capture_cuda_graphs
    decode = capture_decode_graph(model_runner=model_runner)
             ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "{sglang}/srt/model_executor/model_runner_components/cuda_graph_setup.py", line 447, in capture_decode_graph
    runner = graph_runners[model_runner.device](model_runner)
             ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "{sglang}/srt/model_executor/runner/decode_cuda_graph_runner.py", line 277, in __init__
    raise RuntimeError("This should not happen")
'''
# 2_neg_plain_graph
TB_GRAPH_TYPE_ERROR = '''\
  File "{sglang}/srt/managers/scheduler.py", line 985, in init_model_worker
    self.init_all_cuda_graphs()
  File "{sglang}/srt/managers/scheduler.py", line 970, in init_all_cuda_graphs
    self.tp_worker.init_cuda_graphs()
  File "{sglang}/srt/managers/tp_worker.py", line 423, in init_cuda_graphs
    self.model_runner.init_cuda_graphs(
  File "{sglang}/srt/model_executor/model_runner.py", line 944, in init_cuda_graphs
    capture = capture_cuda_graphs(
              ^^^^^^^^^^^^^^^^^^^^
  File "{sglang}/srt/model_executor/model_runner_components/cuda_graph_setup.py", line 115, in capture_cuda_graphs
    model_runner.graph_shared_output = GraphSharedOutput.create_for_model_runner(
                                       ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "{sglang}/srt/model_executor/graph_shared_output.py", line 39, in create_for_model_runner
    max_rows = max(max_rows, model_runner.max_decode_logits_rows())
                             ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "{sglang}/srt/model_executor/model_runner.py", line 766, in max_decode_logits_rows
    capture_bs, _ = get_batch_sizes_to_capture(self, num_tokens_per_req)
                    ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "{sglang}/srt/model_executor/runner/base_cuda_graph_runner.py", line 89, in get_batch_sizes_to_capture
    capture_bs = [bs for bs in capture_bs if bs * alignment_width % mul_base == 0]
                                             ~~~^~~~~~~~~~~~~~~~~
'''
# source: the 0.5.17 call chain from Scheduler.__init__ to MemoryPoolConfig.__post_init__
TB_NOT_ENOUGH_MEMORY = '''\
  File "{sglang}/srt/managers/scheduler.py", line 981, in init_model_worker
    self.init_memory_pools()
  File "{sglang}/srt/managers/scheduler.py", line 953, in init_memory_pools
    self.init_target_memory_pool()
  File "{sglang}/srt/managers/scheduler.py", line 949, in init_target_memory_pool
    self.tp_worker.alloc_memory_pool()
  File "{sglang}/srt/managers/tp_worker.py", line 399, in alloc_memory_pool
    self.model_runner.alloc_memory_pool(memory_pool_config)
  File "{sglang}/srt/model_executor/model_runner.py", line 775, in alloc_memory_pool
    result = self.kv_cache_configurator.configure(
  File "{sglang}/srt/mem_cache/kv_cache_configurator.py", line 247, in configure
    config = self._resolve_memory_pool_config(pre_model_load_memory)
  File "{sglang}/srt/mem_cache/kv_cache_configurator.py", line 1783, in _resolve_memory_pool_config
    config = self.config_from_budget(available_bytes)
  File "{sglang}/srt/mem_cache/kv_cache_configurator.py", line 1804, in config_from_budget
    config = configurator.calculate_pool_sizes(
  File "{sglang}/srt/model_executor/pool_configurator.py", line 326, in calculate_pool_sizes
    return MemoryPoolConfig(max_total_num_tokens=max_total_num_tokens)
  File "<string>", line 13, in __init__
  File "{sglang}/srt/model_executor/pool_configurator.py", line 67, in __post_init__
    raise RuntimeError(msg)
'''
# the same chain up to the rest-memory check, which raises before any pool is sized
TB_WEIGHTS_LEAVE_NO_KV = TB_NOT_ENOUGH_MEMORY.split('  File "{sglang}/srt/mem_cache/kv_cache_configurator.py", line 1783')[0] + \
    '''  File "{sglang}/srt/mem_cache/kv_cache_configurator.py", line 1782, in _resolve_memory_pool_config
    available_bytes = self._profile_available_bytes(pre_model_load_memory)
                      ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "{sglang}/srt/mem_cache/kv_cache_configurator.py", line 1647, in _profile_available_bytes
    raise ValueError(
'''
# source: target graph capture (decode_cuda_graph_runner.py raises "Capture cuda graph failed")
TB_GRAPH_OOM = '''\
  File "{sglang}/srt/managers/scheduler.py", line 985, in init_model_worker
    self.init_all_cuda_graphs()
  File "{sglang}/srt/managers/scheduler.py", line 970, in init_all_cuda_graphs
    self.tp_worker.init_cuda_graphs()
  File "{sglang}/srt/managers/tp_worker.py", line 423, in init_cuda_graphs
    self.model_runner.init_cuda_graphs(
  File "{sglang}/srt/model_executor/model_runner.py", line 944, in init_cuda_graphs
    capture = capture_cuda_graphs(
              ^^^^^^^^^^^^^^^^^^^^
  File "{sglang}/srt/model_executor/model_runner_components/cuda_graph_setup.py", line 144, in capture_cuda_graphs
    decode = capture_decode_graph(model_runner=model_runner)
             ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "{sglang}/srt/model_executor/model_runner_components/cuda_graph_setup.py", line 447, in capture_decode_graph
    runner = graph_runners[model_runner.device](model_runner)
             ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "{sglang}/srt/model_executor/runner/decode_cuda_graph_runner.py", line 417, in __init__
    raise Exception(
'''


def traceback(parts: list[str], exc: str, *, sglang: str, torch: str) -> str:
    """A scheduler traceback: the frame blocks in order, with the package directories filled in
    (a block may also be a frame of the stand-in's own, e.g. a plugin's), then the exception."""
    text = "".join(parts).replace("{sglang}", sglang).replace("{torch}", torch)
    return "Traceback (most recent call last):\n" + text + exc
