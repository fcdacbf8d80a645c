"""Token trie of branches from prompts, references and outputs (Lookahead, section 3.3).

Every window of ``branch_length`` tokens of a sequence is inserted, so the node reached by an
n-gram (n <= branch_length) counts exactly how often that n-gram occurred. Two counts per node:
``freq`` for outputs and ``pfreq`` for prompts/references; a prompt occurrence weighs
``prompt_weight`` output occurrences when drafting. Prompt branches belong to an owner (a request)
and are removed when it ends; output-only nodes are pruned, least frequent first, past capacity.

Invariant used by pruning: a child's counts never exceed its parent's (every occurrence of an
n-gram is also an occurrence of its prefix) and a child was last touched no later than its parent
(an insertion touches the whole path). So the key (freq, last touched) never grows going down, and
removing nodes in ascending key order (deeper first on ties) always removes a leaf.
"""

from __future__ import annotations

import struct
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice

import numpy as np

from ..config import TrieConfig

# Prune key layout (one int64): freq | recency stamp | (DEPTH_CAP - depth), most significant first.
DEPTH_BITS = 8
DEPTH_CAP = (1 << DEPTH_BITS) - 1
STAMP_SHIFT = 40  # the stamp gets 32 bits, freq the 23 above
FREQ_CAP = (1 << 23) - 1


class Node:
    """One trie node: children by token, output count and prompt count."""

    __slots__ = ("children", "freq", "last_output_stamp", "pfreq")

    def __init__(self) -> None:
        self.children: dict[int, Node] = {}
        self.freq = 0  # output occurrences of the n-gram ending here
        self.pfreq = 0  # prompt/reference occurrences (live owners only)
        self.last_output_stamp = 0  # trie clock when an output last passed through (recency, for pruning)

    def weight(self, prompt_weight: float) -> float:
        """Drafting weight: outputs count once, prompt occurrences prompt_weight times."""
        return self.freq + prompt_weight * self.pfreq


def windows(tokens: Sequence[int], length: int) -> Iterator[Sequence[int]]:
    """Every window of ``length`` tokens, plus the shorter tail windows (so counts are exact)."""
    for start in range(len(tokens)):
        yield tokens[start : start + length]


class TokenTrie:
    """A bounded, thread-safe token trie. Mutations and reads hold one lock (cheap, uncontended)."""

    def __init__(self, config: TrieConfig | None = None) -> None:
        self.config = config or TrieConfig()
        self.root = Node()
        self.lock = threading.RLock()
        self._nodes = 0  # all nodes except the root
        self._prompt_nodes = 0  # nodes with pfreq > 0
        self._owners: dict[str, list[tuple[list[int], int]]] = {}  # owner -> (sequence, its windows inserted)
        self.outputs_inserted = 0
        self.clock = 0  # advances once per output (or output step): the recency stamp
        self.prunes = 0  # prune passes that removed nodes (cursors re-anchor after one)

    # ---- sizes -------------------------------------------------------------------------------
    @property
    def node_count(self) -> int:
        """Nodes in the trie (root excluded)."""
        return self._nodes

    @property
    def output_node_count(self) -> int:
        """Nodes that only outputs hold (what capacity bounds)."""
        return self._nodes - self._prompt_nodes

    def nbytes(self) -> int:
        """Approximate memory held by the nodes and their child maps."""
        with self.lock:
            total = 0
            for node in self._iter_nodes():
                total += sys.getsizeof(node) + sys.getsizeof(node.children)
            return total

    def _iter_nodes(self) -> Iterator[Node]:
        stack = [self.root]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    # ---- insertion ---------------------------------------------------------------------------
    def _add_path(self, path: Iterable[int], prompt: bool, count: int) -> None:
        node = self.root
        for token in path:
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = Node()
                self._nodes += 1
            if prompt:
                if child.pfreq == 0:
                    self._prompt_nodes += 1
                child.pfreq += count
            else:
                child.freq += count
                child.last_output_stamp = self.clock
            node = child

    def insert_prompt(self, tokens: Sequence[int], owner: str) -> int:
        """Insert a prompt/reference's windows under ``owner`` (removed by ``remove_owner``), first to last,
        while prompt nodes stay under ``config.max_prompt_nodes``; returns the windows inserted."""
        tokens = list(tokens)
        inserted = 0
        with self.lock:
            for window in windows(tokens, self.config.branch_length):
                if self._prompt_nodes >= self.config.max_prompt_nodes:
                    break
                self._add_path(window, prompt=True, count=1)
                inserted += 1
            self._owners.setdefault(owner, []).append((tokens, inserted))
        return inserted

    def insert_output(self, tokens: Sequence[int], count: int = 1, prune: bool = True) -> None:
        """Insert an output's windows (kept across requests, pruned past capacity)."""
        with self.lock:
            self.clock += 1
            for window in windows(list(tokens), self.config.branch_length):
                self._add_path(window, prompt=False, count=count)
            self.outputs_inserted += 1
            if prune:
                self.maybe_prune()

    def output_cursor(self) -> OutputCursor:
        """A cursor that inserts a growing output token by token (exact counts, O(branch) a token)."""
        return OutputCursor(self)

    # ---- removal / pruning ------------------------------------------------------------------
    def remove_owner(self, owner: str) -> None:
        """Remove every prompt branch inserted under ``owner``; other counts stay unchanged."""
        with self.lock:
            for tokens, inserted in self._owners.pop(owner, []):
                for window in islice(windows(tokens, self.config.branch_length), inserted):
                    self._sub_prompt_path(window)

    def _sub_prompt_path(self, path: Sequence[int]) -> None:
        node = self.root
        trail: list[tuple[Node, int, Node]] = []
        for token in path:
            child = node.children[token]
            trail.append((node, token, child))
            node = child
        for _, _, child in trail:
            child.pfreq -= 1
            if child.pfreq == 0:
                self._prompt_nodes -= 1
        # Drop nodes nothing holds any more, deepest first.
        for parent, token, child in reversed(trail):
            if child.freq == 0 and child.pfreq == 0 and not child.children:
                del parent.children[token]
                self._nodes -= 1

    def maybe_prune(self) -> int:
        """Past capacity, drop the least frequent (then least recent, deepest) output-only nodes.

        One linear walk collects every output-only node's key (freq, last touched, -depth); numpy
        selects the ``excess`` smallest and they are removed in key order, which is leaf-first
        because a node's key is always above its children's. Returns the number removed.
        """
        cap = self.config.capacity
        with self.lock:
            if self.output_node_count <= cap:
                return 0
            excess = self.output_node_count - int(cap * (1.0 - self.config.prune_slack))
            # Pre-order walk (parents before children); a node's recency is the latest stamp in its
            # subtree, so a parent's key is never below a child's even when a cursor stamped only
            # the new n-gram ends.
            nodes: list[Node] = []
            parent_of: list[int] = []
            token_of: list[int] = []
            depth_of: list[int] = []
            walk: list[tuple[Node, int, int, int]] = [(self.root, -1, 0, 0)]
            while walk:
                node, parent, token, depth = walk.pop()
                here = len(nodes)
                nodes.append(node)
                parent_of.append(parent)
                token_of.append(token)
                depth_of.append(min(depth, DEPTH_CAP))
                walk.extend((child, here, tok, depth + 1) for tok, child in node.children.items())
            recent = [n.last_output_stamp for n in nodes]
            for i in range(len(nodes) - 1, 0, -1):
                if recent[i] > recent[parent_of[i]]:
                    recent[parent_of[i]] = recent[i]
            keys: list[int] = []
            parents: list[Node] = []
            tokens: list[int] = []
            for i in range(1, len(nodes)):
                node = nodes[i]
                if node.pfreq == 0:
                    freq = min(node.freq, FREQ_CAP)
                    keys.append((freq << STAMP_SHIFT) | (recent[i] << DEPTH_BITS) | (DEPTH_CAP - depth_of[i]))
                    parents.append(nodes[parent_of[i]])
                    tokens.append(token_of[i])
            arr = np.asarray(keys, dtype=np.int64)
            chosen = np.argpartition(arr, excess - 1)[:excess]
            removed = 0
            for i in chosen[np.argsort(arr[chosen], kind="stable")].tolist():
                parent, token = parents[i], tokens[i]
                child = parent.children.get(token)
                if child is None or child.children:  # cannot happen: keys order leaves first
                    continue
                del parent.children[token]
                self._nodes -= 1
                removed += 1
            self.prunes += bool(removed)
            return removed

    # ---- lookup ------------------------------------------------------------------------------
    def find(self, tokens: Sequence[int]) -> Node | None:
        """The node reached by ``tokens`` from the root, or None."""
        node = self.root
        for token in tokens:
            node = node.children.get(token)
            if node is None:
                return None
        return node

    def branches(self, node: Node | None = None, prefix: tuple[int, ...] = ()) -> Iterator[tuple[int, ...]]:
        """Every root-to-leaf path under ``node`` (for tests and snapshots)."""
        node = node or self.root
        if not node.children and prefix:
            yield prefix
        for token, child in node.children.items():
            yield from self.branches(child, (*prefix, token))

    # ---- snapshot ----------------------------------------------------------------------------
    _REC = struct.Struct("<qqI")  # token, freq, number of children (pre-order)

    def dump_outputs(self) -> bytes:
        """Serialize the output counts (prompt branches are request-scoped and not kept)."""
        out = bytearray()
        with self.lock:
            out += struct.pack("<qq", self.config.branch_length, self.outputs_inserted)

            def visit(token: int, node: Node) -> None:
                kids = [(t, c) for t, c in node.children.items() if c.freq > 0]
                out.extend(self._REC.pack(token, node.freq, len(kids)))
                for t, c in kids:
                    visit(t, c)

            visit(-1, self.root)
        return bytes(out)

    @classmethod
    def load_outputs(cls, data: bytes, config: TrieConfig | None = None) -> TokenTrie:
        """Rebuild a trie from ``dump_outputs`` bytes."""
        branch_length, outputs = struct.unpack_from("<qq", data, 0)
        config = config or TrieConfig(branch_length=int(branch_length))
        trie = cls(config)
        trie.outputs_inserted = int(outputs)
        offset = struct.calcsize("<qq")
        rec = cls._REC
        _, _, n_root = rec.unpack_from(data, offset)
        offset += rec.size
        stack: list[tuple[Node, int]] = [(trie.root, n_root)]
        while stack:
            parent, remaining = stack.pop()
            if remaining == 0:
                continue
            stack.append((parent, remaining - 1))
            token, freq, n_kids = rec.unpack_from(data, offset)
            offset += rec.size
            node = parent.children[token] = Node()
            node.freq = freq
            trie._nodes += 1
            stack.append((node, n_kids))
        return trie


class OutputCursor:
    """Inserts an output as it grows: each new token extends every open window by one."""

    def __init__(self, trie: TokenTrie) -> None:
        self.trie = trie
        self._open: list[Node] = []  # nodes of the suffixes of length 1..branch_length-1
        self._tail: list[int] = []  # the last branch_length-1 tokens fed
        self._prunes = trie.prunes  # prune passes seen: a new one may have detached _open nodes

    def _reanchor(self, stamp: int) -> None:
        """After a prune, find (or re-create, as this output's own occurrence) the open suffix paths."""
        trie = self.trie
        self._open = []
        for n in range(1, len(self._tail) + 1):
            node = trie.root
            for token in self._tail[len(self._tail) - n :]:
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = Node()
                    child.freq, child.last_output_stamp = 1, stamp
                    trie._nodes += 1
                node = child
            self._open.append(node)
        self._prunes = trie.prunes

    def feed(self, tokens: Iterable[int]) -> None:
        """Append tokens; each n-gram ending at a new token (n <= branch_length) gains one count."""
        trie = self.trie
        limit = trie.config.branch_length
        with trie.lock:
            trie.clock += 1
            stamp = trie.clock
            if trie.prunes != self._prunes:
                self._reanchor(stamp)
            for token in tokens:
                nxt: list[Node] = []
                for node in [trie.root, *self._open]:
                    child = node.children.get(token)
                    if child is None:
                        child = node.children[token] = Node()
                        trie._nodes += 1
                    child.freq += 1
                    child.last_output_stamp = stamp
                    nxt.append(child)
                self._open = nxt[: limit - 1]
                self._tail = [*self._tail, token][-(limit - 1) :]

    def close(self) -> None:
        """Finish this output (count it and prune if past capacity)."""
        with self.trie.lock:
            self.trie.outputs_inserted += 1
            self.trie.maybe_prune()
        self._open = []
