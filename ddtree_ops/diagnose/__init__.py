"""Failure diagnosis: the signature catalogue, the classifier, and the live-host reader.

`classify.classify(lines) -> Report` and `classify.Scanner` (incremental, for the deploy gate) are
the entry points; `live.diagnose_host(host, profile)` adds unit state, kernel log, GPU snapshot
and static configuration checks for `ddtree-ops diagnose HOST`.
"""
