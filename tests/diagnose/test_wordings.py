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
    # ---- bad_launch_flags (gpu visibility)
    ("RuntimeError: device 1 is not visible (CUDA_VISIBLE_DEVICES=0)", "bad_launch_flags", "torch/cuda/__init__.py"),
    # ---- flashinfer_jit_error: the JIT toolchain itself
    ("FileNotFoundError: nvcc not found at '/usr/local/cuda/bin/nvcc'. Ensure CUDA path '/usr/local/cuda' is correct.",
     "flashinfer_jit_error", "torch/utils/cpp_extension.py"),
    ("RuntimeError: The current installed version of g++ (14.2.0) is greater than the maximum required version by "
     "CUDA 12.4. Please make sure to use an adequate version of g++ (>=6.0.0, <14.0).", "flashinfer_jit_error",
     "torch/utils/cpp_extension.py"),
]


@pytest.mark.parametrize("line, label, source", WORDINGS, ids=[f"{w[1]}:{w[0][:40]}" for w in WORDINGS])
def test_a_wording_from_the_source_names_its_class(line: str, label: str, source: str) -> None:
    rep = classify([line])
    assert rep.root_cause is not None and rep.root_cause.label == label, (source, rep.root_cause)
