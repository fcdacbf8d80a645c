"""Draft sources behind one seam (``base.Proposer``), built for a request in one place (``build.py``).

- ``trie.TrieProposer``: the request's token trie (prompt, references, past answers): hierarchical
  trees, parallel chains or the LLMA span;
- ``jacobi.JacobiProposer``: the Jacobi lookahead window (extra rows in the forward) and its n-gram pool;
- ``draft_model.DraftModelProposer``: a draft model's top-k token tree (SpecInfer);
- ``mjsd.MjsdProposer``: a draft model's beams, accepted by joint likelihood (lossy, opt-in);
- ``base.DrafterProposer``: a caller's own drafting function (tests feed adversarial trees through it).
"""
