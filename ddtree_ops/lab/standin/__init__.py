"""ddtree-ops LAB STAND-IN for `python -m sglang.launch_server` (and for nvidia-smi).

Installed on the lab hosts only, as the package `sglang_standin` in /opt/sglang/venv. The lab hosts
have no GPU, so no model is loaded and no token is computed; everything else is real: the host's own
sglang 0.5.23 parses the flags (`prepare_server_args`), loads plugins (`load_plugins`) and resolves the
algorithm (`SpeculativeAlgorithm.from_string`); the KV pool is sized with SGLang's formula from the
model config and the simulated GPU; the log lines are what real SGLang 0.5.17 printed on an H200 for
the same scenario (`lines.py`; kept so by tests/lab/test_standin_conformance.py); the HTTP endpoints
answer in SGLang's shapes; with the ddtree plugin installed, its own shadow accounting runs on simulated
rounds (`shadow.py`). Nothing here runs on a real GPU host.
"""

STANDIN_LABEL = "ddtree-ops LAB STAND-IN"
SGLANG_VERSION = "0.5.23"
