"""ddtree-ops LAB STAND-IN for `python -m sglang.launch_server` (this host has no GPU).

Installed over sglang/launch_server.py on lab hosts only, so the rendered unit runs exactly what a real
host runs. The stand-in parses the flags with this sglang's own parser and plugin loader, then
simulates the server: see sglang_standin/__init__.py and /etc/ddtree-lab/README.
"""
import sys

if __name__ == "__main__":
    from sglang_standin.server import main

    sys.exit(main(sys.argv[1:]))
