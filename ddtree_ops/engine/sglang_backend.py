"""The tree verify backend's contract, and the pieces of a tree round that do not change with SGLang.

A backend serves a tree round on one SGLang release: the draft, one TARGET_VERIFY forward over the
tree's nodes under an ancestor-only mask, the target's choice at every node, the accepted path
committed. That is SGLang's machinery (different in every release, GPU only), so it is found by the
entry point group `ddtree_ops.tree_verify`, under the release it serves or `*`:

    [project.entry-points."ddtree_ops.tree_verify"]
    "0.5.17" = "some_package.module:Backend"

The plugin wheel declares SGLang 0.5.17's (`sglang_backend_0517`, issue 33: SGLang's own TARGET_VERIFY
with an ancestor mask, its accept walked on the host, the path committed in its KV pool); the lab's
stand-in declares its simulated one. `tree_problem` is what the validator, preflight and the
tree worker say where there is none. The tree (`build_tree`: `shadow.heap_tree`, the shadow's own
build) and the walks over the target's choices are here, free of SGLang, so that they are tested on
CPU and shared by the tree worker (`sglang_tree`) and any backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol

from ddtree_ops.engine.sglang_settings import release_of
from ddtree_ops.engine.shadow import heap_tree

BACKEND_GROUP = "ddtree_ops.tree_verify"
ANY_RELEASE = "*"
ISSUE = "issue 33"
NO_BACKEND = ("no tree verify backend for sglang {version} (entry point group " + BACKEND_GROUP + "): the plugin "
              "verifies a tree on SGLang 0.5.17 only (" + ISSUE + "); serve ddtree-shadow meanwhile")


# ------------------------------------------------------------------ the tree and its walks


@dataclass
class RowTree:
    """One row's tree: node 0 is the root (the last committed token)."""

    children: list[dict[int, int]]     # node -> {token: child}
    ranks: list[int]                   # node -> its token's rank at its depth (root 0)
    tokens: list[int]                  # node -> token
    parents: list[int]                 # node -> parent (root -1)
    depths: list[int]                  # node -> depth (root 0)
    spine: list[int]                   # the rank-0 path from the root: spine[d] is the node at depth d
    horizon: int = 0                   # the draft's depth: a whole spine has horizon + 1 nodes

    @property
    def size(self) -> int:
        return len(self.tokens)


def build_tree(tok: list[list[int]], sc: list[list[int]], budget: int, root_token: int,
               spine: bool | None = None) -> RowTree:
    """The served tree from one row's draft top-K per depth: `heap_tree`, the shadow's own build (its
    default `tree_shape.spine_for`: where the budget holds the chain, the spine first, then the rest
    of the budget best-first)."""
    children, ranks = heap_tree(tok, sc, budget, spine)
    n = len(children)
    tokens, parents, depths = [root_token] + [0] * (n - 1), [-1] * n, [0] * n
    for node in range(n):
        for token, child in children[node].items():
            tokens[child], parents[child], depths[child] = token, node, depths[node] + 1
    path, node = [0], 0
    while True:
        nxt = next((c for c in children[node].values() if ranks[c] == 0), None)
        if nxt is None:
            break
        path.append(nxt)
        node = nxt
    return RowTree(children, ranks, tokens, parents, depths, path, len(tok))


def walk(tree: RowTree, predict: list[int]) -> tuple[list[int], int]:
    """The target's choices down the tree (`verify.walk`): accepted nodes (root first) and the bonus."""
    path, node = [0], 0
    while predict[node] in tree.children[node]:
        node = tree.children[node][predict[node]]
        path.append(node)
    return path, predict[node]


def spine_tokens(tree: RowTree, predict: list[int]) -> int | None:
    """What the chain alone commits this round, bonus included: the walk along the spine only (the
    chain's verify sees the same ancestors at every spine node, so the target's choices are the same).
    None when the walk reaches the end of a spine cut short of the horizon (a budget below it): what
    the chain would have accepted past the cut is not known."""
    d = 0
    while d + 1 < len(tree.spine) and predict[tree.spine[d]] == tree.tokens[tree.spine[d + 1]]:
        d += 1
    if d + 1 == len(tree.spine) and d < tree.horizon:
        return None
    return d + 1


def sibling_depths(tree: RowTree, path: list[int]) -> list[int]:
    return [tree.depths[n] for n in path[1:] if tree.ranks[n] > 0]


# ------------------------------------------------------------------ the backend


@dataclass
class TreeRound:
    """What a backend's tree round hands back."""

    result: Any                              # returned to SGLang's scheduler: what the round commits
    trees: list[RowTree]                     # the trees verified, one per row
    accepted: list[list[int]]                # per row: the node path committed (root first)
    predict: list[list[int] | None]          # per row: the target's greedy choice at every node (None: sampled)
    seconds: float | None = None             # the verify forward's device time, where measured


Build = Callable[[list[list[int]], list[list[int]], int], RowTree]


class TreeVerifyBackend(Protocol):
    """What serves a tree round on one SGLang release (SGLang's own tree verify, issue 33; the lab's
    simulated one). Each method gets the worker and the batch as SGLang hands them over."""

    name: str

    def tree_round(self, worker: Any, batch: Any, build: Build, **forward_kwargs: Any) -> TreeRound:
        """Run the draft, take its top-K (`worker.ddtree_round_topk`), build each row's tree with
        `build(tokens, scores, root_token)`, verify them in one forward, commit the accepted paths.
        `forward_kwargs` are what SGLang's scheduler passed to forward_batch_generation (the overlap
        scheduler's `on_publish`, which a round must call with the new sequence lengths)."""

    def chain_round(self, worker: Any, batch: Any, forward: Callable[[], Any]) -> tuple[Any, float | None]:
        """DFlash's own round (`forward()`), and its verify forward's device seconds if measured."""

    def probe(self, worker: Any, batch: Any, nodes: int) -> float | None:
        """Shadow mode: the device seconds of a tree verify forward of `nodes` tokens a row over this
        batch, its result discarded (what a tree round would cost here, now)."""

    # optional: `problems(worker) -> list[str]`, what this backend cannot serve on this server (page
    # size, attention backend, ...), which the tree worker says at start and refuses to start on


def declared(found: Mapping[str, Any], version: str | None) -> Any:
    """The entry point (or its value) declared for this SGLang release, else for any release, else None."""
    return found.get(release_of(version) or str(version)) or found.get(ANY_RELEASE)


def find_backend(version: str | None) -> tuple[Any, str]:
    """(the tree verify backend for this SGLang release, '') or (None, why there is none)."""
    from importlib.metadata import entry_points

    ep = declared({ep.name: ep for ep in entry_points(group=BACKEND_GROUP)}, version)
    if ep is None:
        return None, NO_BACKEND.format(version=version or "unknown")
    try:
        made = ep.load()
        return (made() if isinstance(made, type) else made), ""
    except Exception as exc:         # a broken backend is a refusal with its reason, never a crash at import
        return None, f"the tree verify backend {ep.value} could not be loaded: {type(exc).__name__}: {exc}"


def tree_problem(version: str | None) -> str | None:
    """None when DDTREE_MODE=tree can be served on this SGLang; else the sentence the validator,
    preflight and the worker say."""
    backend, why = find_backend(version)
    return None if backend is not None else f"DDTREE_MODE=tree: {why}"


def is_verify_round(batch: Any) -> bool:
    """Whether SGLang hands the worker a verify round (decided before the round runs: real 0.5.17
    hands the batch back in TARGET_VERIFY mode, which ForwardMode.is_extend() counts as an extend)."""
    mode = getattr(batch, "forward_mode", None)
    if mode is None:
        return False
    target_verify = getattr(mode, "is_target_verify", None)
    if target_verify is not None and target_verify():
        return True
    if mode.is_extend() or getattr(batch, "is_extend_in_batch", False) or mode.is_idle():
        return False
    return True
