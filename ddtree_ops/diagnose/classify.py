"""Classify a journal or log: lines in, findings and a root cause out (the public face).

The work is split by concern (docs/architecture.md, docs/diagnose.md):
- `catalogue`: the signature catalogue's schema, parsing and search structures;
- `context`: what the log says about the start, and the resolvers that name a cause from it;
- `facts`: SGLang's memory numbers and the accept-length streak;
- `findings`: `Finding`, `Report`, the signature of an unnamed crash;
- `root`: the choice of the root cause among findings;
- `scanner`: the incremental `Scanner` and `classify` / `classify_bytes` / `classify_stream`;
- `parallel`: `classify_path`, the keyword screen in worker processes for large files.

Callers (the deploy gate, the CLI, `diagnose HOST`) import from here.
"""

from __future__ import annotations

from ddtree_ops.diagnose.catalogue import LABELS, Catalogue, Rule, load_catalogue, parse_catalogue, screen_for
from ddtree_ops.diagnose.findings import Finding, Report
from ddtree_ops.diagnose.parallel import classify_path
from ddtree_ops.diagnose.root import choose_root, verdict_of
from ddtree_ops.diagnose.scanner import Scanner, classify, classify_bytes, classify_stream
from ddtree_ops.diagnose.screen import CatalogueError

__all__ = ["LABELS", "CatalogueError", "Catalogue", "Rule", "Finding", "Report", "Scanner", "classify",
           "classify_bytes", "classify_stream", "classify_path", "load_catalogue", "parse_catalogue", "screen_for",
           "choose_root", "verdict_of"]
