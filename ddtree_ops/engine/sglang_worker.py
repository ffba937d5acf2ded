"""The DDTREE worker inside SGLang: DFlash's V2 worker, chain path untouched, plus shadow accounting.

This module imports SGLang's DFlash worker, which needs SGLang's GPU stack: it is imported only by
the plugin's worker factory at server start. Everything it adds lives in `ShadowWorkerMixin`
(`sglang_shadow.py`), which is tested on CPU against the DFlash worker source of every release in
`sglang_settings.SUPPORTED`; this file only composes the two.
"""

from __future__ import annotations

from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

from ddtree_ops.engine.sglang_shadow import ShadowWorkerMixin


class DDTreeShadowWorker(ShadowWorkerMixin, DFlashWorkerV2):
    """Commits what DFlash commits; records what the DDTree tree would have accepted."""
