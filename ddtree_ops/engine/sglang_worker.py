"""The DDTREE workers inside SGLang: DFlash's V2 worker plus shadow accounting, or serving the tree.

This module imports SGLang's DFlash worker, which needs SGLang's GPU stack: it is imported only by
the plugin's worker factory at server start. Everything it adds lives in `ShadowWorkerMixin`
(`sglang_shadow.py`) and `TreeWorkerMixin` (`sglang_tree.py`), which are tested on CPU against the
DFlash worker source of every release in `sglang_settings.SUPPORTED`; this file only composes them.
"""

from __future__ import annotations

from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

from ddtree_ops.engine.sglang_shadow import ShadowWorkerMixin
from ddtree_ops.engine.sglang_tree import TreeWorkerMixin


class DDTreeShadowWorker(ShadowWorkerMixin, DFlashWorkerV2):
    """Commits what DFlash commits; records what the DDTree tree would have accepted."""


class DDTreeTreeWorker(TreeWorkerMixin, DFlashWorkerV2):
    """Serves the tree through the release's tree verify backend (`sglang_backend`); refuses to start
    where there is none (every SGLang release but 0.5.17, issue 33)."""
