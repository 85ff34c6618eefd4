"""Prefix index: a tree of block nodes holding KV and STATE entries, with per-tier residency.

A node is one block hash (prefixed by the compatibility identity, so identities never meet).
It exists while it holds an entry or has children. A node with >= 1 STATE entry is a
checkpoint node (`own`). A node is `live` when its subtree holds a checkpoint; `live_children`
counts live children, so both are maintained by walks that stop at the first node whose status
does not change (cost proportional to what changed, never to the depth of the prompt).

From that, exactly (see eviction.py for the units built on it):
  leaf checkpoint  own and no live child
  seg(leaf)        the leaf and its ancestors up to (excluding) the first one that is own or
                   has >= 2 live children: KV chunks used by no other checkpoint
  orphan node      dead (not live) node: its KV chunks are used by no checkpoint

Every status change adds the checkpoint/orphan nodes whose unit may have changed to `dirty`
(the eviction side recomputes their cost, size and score lazily). `kok` marks nodes whose
whole KV path is committed; it is monotone along a prompt, so lookups binary-search it.
"""

from __future__ import annotations

from .types import Item, Kind, Tier

TIER_BIT = {Tier.DRAM: 1, Tier.SSD: 2}
MANAGED = (Tier.DRAM, Tier.SSD)
_KV = Kind.KV  # enum members read through the class are slow in a hot path


class Entry:
    """One key. `resident`/`pending` are bitmasks of TIER_BIT."""

    __slots__ = ("key", "node", "kind", "group", "nbytes", "resident", "pending", "born",
                 "touch", "sver", "terminal", "pins")

    def __init__(self, item: Item, node: Node, group: int):
        self.key = item.key
        self.node = node
        self.kind = item.kind
        self.group = group
        self.nbytes = item.nbytes
        self.terminal = item.terminal
        self.resident = 0
        self.pending = 0
        self.born = 0.0  # first admission (residence-time EMAs)
        self.touch = 0  # global sequence number of the last commit or hit (stage-1 LRU)
        self.sver = [0, 0, 0]  # stage-1 heap entry version per tier
        self.pins = 0

    def present(self) -> bool:
        return bool(self.resident | self.pending)


class Node:
    __slots__ = ("nid", "hash", "parent", "children", "position", "kv", "st", "live_children",
                 "bundle", "seg", "t_last", "hver", "cost", "mb", "req", "rkv", "rst", "kok",
                 "gone", "credit")

    def __init__(self, nid: bytes, block_hash: bytes, position: int):
        self.credit = False  # holds a checkpoint taken on credit (core.py)
        self.nid = nid
        self.hash = block_hash
        self.parent: Node | None = None
        self.children: dict[bytes, Node] = {}
        self.position = position
        self.kv: dict[int, Entry] = {}
        self.st: dict[int, Entry] = {}
        self.live_children = 0
        self.bundle: Node | None = None  # the leaf whose seg holds this node's KV
        self.seg: list[Node] | tuple = ()  # for a leaf checkpoint: its seg, leaf first
        self.t_last = 0.0
        self.hver = [0, 0, 0]  # eviction heap entry version per tier
        self.cost: float | None = None  # cached C of the unit anchored here (None: no unit)
        self.mb = [0, 0, 0]  # cached unit bytes committed per tier (M before scaling)
        self.req = ""  # request that created the node's KV (protects in-flight orphans)
        # KV / STATE entries with at least one committed copy (fast complete-node test).
        self.rkv = 0
        self.rst = 0
        # Every block from the first to this one has all its KV groups committed somewhere.
        # Monotone along a prompt, so a lookup can binary-search the shared prefix.
        self.kok = False
        self.gone = False  # pruned from the index (a new node may later take its id)

    @property
    def own(self) -> bool:
        return bool(self.st)

    @property
    def live(self) -> bool:
        return bool(self.st) or self.live_children > 0

    def __repr__(self) -> str:
        return f"Node(pos={self.position}, own={self.own}, live_children={self.live_children})"


class PrefixIndex:
    def __init__(self, block_tokens: int, dirty: dict[Node, None]):
        self.block_tokens = block_tokens
        self.nodes: dict[bytes, Node] = {}
        self.entries: dict[bytes, Entry] = {}
        # Nodes whose unit may have changed; shared with the evictor, which re-scores them.
        self.dirty = dirty
        self.nkv = 0  # KV groups a complete node holds (set by the core)

    # -- nodes -------------------------------------------------------------------------------
    def _get_or_make(self, nid: bytes, block_hash: bytes, position: int) -> Node:
        n = self.nodes.get(nid)
        if n is None:
            n = self.nodes[nid] = Node(nid, block_hash, position)
        return n

    def _link(self, node: Node, parent: Node) -> None:
        node.parent = parent
        parent.children[node.nid] = node
        if node.st or node.live_children:
            self._became_live_below(parent)
        if node.rkv >= self.nkv and (parent.kok or node.kok):
            self.update_kok(node)

    # -- committed-KV path flags -----------------------------------------------------------------
    def _kok_of(self, n: Node) -> bool:
        if n.rkv < self.nkv:
            return False
        p = n.parent
        return p.kok if p is not None else n.position <= self.block_tokens

    def update_kok(self, n: Node) -> None:
        """n's committed KV count or parent changed: fix its flag and its subtree's."""
        new = self._kok_of(n)
        if new == n.kok:
            return
        n.kok = new
        nkv = self.nkv
        stack = [n]
        while stack:
            x = stack.pop()
            ok = x.kok
            for c in x.children.values():
                cn = ok and c.rkv >= nkv
                if cn != c.kok:
                    c.kok = cn
                    stack.append(c)

    def recompute_kok(self) -> None:
        """All flags from scratch (the number of KV groups changed)."""
        for n in sorted(self.nodes.values(), key=lambda n: n.position):
            n.kok = self._kok_of(n)

    def add(self, item: Item, identity: bytes, group: int) -> Entry:
        """Create the entry for a new key (no residency yet) and hook it into the tree."""
        nodes = self.nodes
        nid = identity + item.node if identity else item.node
        node = nodes.get(nid)
        if node is None:
            node = nodes[nid] = Node(nid, item.node, item.position)
        if node.parent is None and item.parent is not None:
            if item.parent == item.node:
                # A self-loop would make every upward walk spin forever.
                raise ValueError(f"item {item.key.hex()} names its own block as its parent")
            pnid = identity + item.parent if identity else item.parent
            parent = nodes.get(pnid)
            if parent is None:
                parent = nodes[pnid] = Node(pnid, item.parent,
                                            item.position - self.block_tokens)
            self._link(node, parent)
        e = Entry(item, node, group)
        self.entries[item.key] = e
        if item.kind is _KV:
            node.kv[group] = e
            if node.bundle is not None:
                self.dirty[node.bundle] = None
            elif not node.st and not node.live_children:
                self.dirty[node] = None  # orphan unit
        else:
            was_own = bool(node.st)
            node.st[group] = e
            if not was_own:
                self._set_own(node)
            else:
                self.dirty[node] = None
        return e

    def drop(self, e: Entry) -> None:
        """Forget a key entirely (no copy left anywhere)."""
        assert not e.resident and not e.pending
        del self.entries[e.key]
        node = e.node
        if e.kind is _KV:
            del node.kv[e.group]
            self._kv_changed(node)
        else:
            del node.st[e.group]
            if not node.st:
                self._unset_own(node)
            else:
                self.dirty[node] = None
        self._prune(node)

    def _prune(self, node: Node | None) -> None:
        while node is not None and not node.kv and not node.st and not node.children:
            del self.nodes[node.nid]
            node.gone = True
            parent = node.parent
            if parent is not None:
                del parent.children[node.nid]
            node.parent = None
            self.dirty[node] = None
            node = parent

    def _kv_changed(self, node: Node) -> None:
        """A KV entry of `node` appeared, vanished or changed residency."""
        b = node.bundle
        if b is not None:
            self.dirty[b] = None
        elif not node.st and not node.live_children:
            self.dirty[node] = None  # orphan unit

    # -- liveness ----------------------------------------------------------------------------
    def _set_own(self, m: Node) -> None:
        """`m` just got its first STATE entry."""
        self.dirty[m] = None
        if m.bundle is not None:
            self.dirty[m.bundle] = None  # its seg now stops below m
        if m.live_children:
            for d in self.cp_children(m):
                self.dirty[d] = None  # their nearest checkpoint above is now m
            a = self.cp_parent(m)
            if a is not None:
                self.dirty[a] = None
        elif m.parent is not None:
            # m was dead: everything up to the first live ancestor comes alive.
            self._became_live_below(m.parent)

    def _became_live_below(self, p: Node) -> None:
        """A child of `p` became live: walk up while nodes come alive."""
        while p is not None:
            was_live = p.live
            p.live_children += 1
            if was_live:
                if p.own:
                    self.dirty[p] = None  # maybe no longer a leaf; its cp-children changed
                else:
                    if p.bundle is not None:
                        self.dirty[p.bundle] = None  # seg now stops below p
                    a = self.cp_parent(p)
                    if a is not None:
                        self.dirty[a] = None
                return
            self.dirty[p] = None  # was an orphan
            p = p.parent

    def _unset_own(self, m: Node) -> None:
        """`m` lost its last STATE entry."""
        dirty = self.dirty
        dirty[m] = None
        if m.live_children:
            a = self.cp_parent(m)
            if a is not None:
                dirty[a] = None
            for d in self.cp_children(m):
                dirty[d] = None
            if m.live_children == 1:
                leaf = self.leaf_below(m)
                if leaf is not None:
                    dirty[leaf] = None
            return
        # m is dead now: walk up while nodes die; the walk's end leads to m's nearest
        # checkpoint above, whose checkpoint children changed.
        p = m.parent
        while p is not None:
            p.live_children -= 1
            if p.st:
                dirty[p] = None
                return
            if p.live_children == 0:
                dirty[p] = None  # now an orphan
                p = p.parent
                continue
            if p.live_children == 1:
                leaf = self.leaf_below(p)
                if leaf is not None:
                    dirty[leaf] = None
            a = self.cp_parent(p)
            if a is not None:
                dirty[a] = None
            return

    # -- structure queries (walk only between checkpoints) -----------------------------------
    def cp_parent(self, n: Node) -> Node | None:
        p = n.parent
        while p is not None and not p.st:
            p = p.parent
        return p

    def cp_children(self, n: Node, limit: int = 0) -> list[Node]:
        """Nearest checkpoints below n (stop after `limit` of them when limit > 0)."""
        out: list[Node] = []
        stack: list[Node] = []
        for c in n.children.values():
            if c.st:
                out.append(c)
                if len(out) == limit:
                    return out
            elif c.live_children:
                stack.append(c)
        while stack:
            x = stack.pop()
            if x.st:
                out.append(x)
                if len(out) == limit:
                    break
            elif x.live_children == 1 and len(x.children) == 1:
                stack.extend(x.children.values())
            else:
                stack.extend(c for c in x.children.values() if c.st or c.live_children)
        return out

    def leaf_below(self, p: Node) -> Node | None:
        """The leaf checkpoint that p's single live chain leads to, if the chain has no fork."""
        x = p
        while True:
            nxt = None
            for c in x.children.values():
                if c.live:
                    nxt = c
                    break
            if nxt is None:
                return None
            x = nxt
            if x.st:
                return x if x.live_children == 0 else None
            if x.live_children != 1:
                return None

    def compute_seg(self, leaf: Node) -> list[Node]:
        seg = [leaf]
        x = leaf.parent
        while x is not None and not x.st and x.live_children == 1:
            seg.append(x)
            x = x.parent
        return seg

    def path_kv_missing(self, n: Node, kv_groups: int) -> Node | None:
        """First node from n upward (to the nearest checkpoint) whose KV is incomplete.

        A checkpoint above n already has its whole path (the index invariant), so the walk stops
        there. `kv_groups` = number of KV groups a complete node holds.
        """
        x = n
        while True:
            if len(x.kv) < kv_groups:
                return x
            if x is not n and x.st:
                return None
            if x.parent is None:
                # A root must be the first block; otherwise its ancestors are unknown.
                return x if x.position > self.block_tokens else None
            x = x.parent
