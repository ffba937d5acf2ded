"""ddtree-ops: deploy, gate, diagnose and roll back SGLang speculative-decoding services."""

__version__ = "0.1.0"
