"""No draft hidden-state relay for DDTREE: `spec_need_hidden_states()` answers as for DFLASH.

SGLang's overlap scheduler relays each round's draft input to the next through a FutureMap. At
its first stash the map decides whether to relay draft hidden states with
`spec_utils.spec_need_hidden_states()`, which exempts algorithms by their literal name
("STANDALONE", "DFLASH", "DSPARK"), not by `is_dflash_family()`. DFlash's draft input carries an
empty (bs, 0) hidden-state tensor, not None, so for DDTREE the map allocated a buffer and
scattered and gathered that empty tensor every round (0.5.17 `FutureMap._lazy_init_forward_buf`,
0.5.23 `_maybe_init_forward_bufs`): launches for nothing.

A plugin cannot register an answer to that question, so the worker factory, which SGLang calls
in the scheduler process of a DDTREE server before the FutureMap exists, replaces the module
function with one that answers False, DFLASH's answer, and says so in the log. Only the module
attribute changes (both releases' callers import it from `spec_utils` at call time, which the
CPU tests check in each release's source); nothing on disk.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from ddtree_ops.engine.sglang_settings import NAME

logger = logging.getLogger("ddtree_ops.engine.sglang")

FUNCTION = "spec_need_hidden_states"
PATCHED = ("DDTREE: spec_need_hidden_states() answers False for DDTREE, as for DFLASH: no draft hidden-state "
           "relay through the overlap FutureMap")


def exempt_module(module: Any) -> bool:
    """Wrap `module.spec_need_hidden_states` so it answers False; idempotent. False if the module
    has no such function (a release that decides it otherwise: nothing to do)."""
    original = getattr(module, FUNCTION, None)
    if original is None:
        return False
    if getattr(original, "ddtree_exempt", False):
        return True

    @functools.wraps(original)
    def spec_need_hidden_states(*args: Any, **kwargs: Any) -> bool:
        return False        # DDTREE's draft input is DFlash's: it carries no hidden states to relay

    spec_need_hidden_states.ddtree_exempt = True            # type: ignore[attr-defined]
    spec_need_hidden_states.ddtree_original = original      # type: ignore[attr-defined]
    setattr(module, FUNCTION, spec_need_hidden_states)
    return True


def exempt_from_hidden_relay(server_args: Any) -> bool:
    """In a process serving DDTREE, make the relay decision DFLASH's. Logged once."""
    if str(getattr(server_args, "speculative_algorithm", "") or "").upper() != NAME:
        return False
    import importlib

    try:
        spec_utils = importlib.import_module("sglang.srt.speculative.spec_utils")
    except Exception as exc:        # an import chain this release lacks: the relay stays as it is
        logger.warning("DDTREE: cannot reach spec_utils (%s); the overlap FutureMap may relay empty hidden states",
                       exc)
        return False
    already = getattr(getattr(spec_utils, FUNCTION, None), "ddtree_exempt", False)
    done = exempt_module(spec_utils)
    if done and not already:
        logger.info(PATCHED)
    elif not done:
        logger.info("DDTREE: this sglang has no spec_utils.%s; nothing to exempt", FUNCTION)
    return done
