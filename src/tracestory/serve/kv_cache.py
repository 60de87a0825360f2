"""Paged KV-cache bookkeeping: which physical block holds which tokens of which request.

Model: the cache is ``num_blocks`` blocks of ``block_size`` token slots each (the tensors live in
:mod:`.model`; this module only does the accounting, so it is testable alone). A request owns
a *block table*: the list of block ids holding its tokens in order, token position ``p`` lives
in block ``table[p // block_size]`` at offset ``p % block_size``. A request holding ``n``
tokens owns exactly ``ceil(n / block_size)`` blocks.

Free list: a stack (LIFO). The most recently freed blocks are handed out first, so a request
admitted right after another finished reuses exactly the blocks that one returned (the
"contiguous reuse" of the batching story), and a fresh cache hands out 0, 1, 2, ... in order.

Invariants (checked by :meth:`BlockManager.check`): every block is either on the free list or in
exactly one block table, never both, never twice.

Limits: no prefix sharing, no copy-on-write, no swapping to host memory (preemption in the
scheduler recomputes instead).
"""

from __future__ import annotations

from ..errors import TracestoryError


class KVCacheFull(TracestoryError):
    """An allocation asked for more blocks than are free."""


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks needed to hold ``tokens`` tokens: ``ceil(tokens / block_size)``."""
    return -(-tokens // block_size)


class BlockManager:
    """Free list + per-request block tables over ``num_blocks`` blocks of ``block_size`` tokens."""

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = int(num_blocks)
        self.block_size = int(block_size)
        # stack: the end of the list is handed out first, so a fresh cache gives 0, 1, 2, ...
        self._free: list[int] = list(range(self.num_blocks - 1, -1, -1))
        self._tables: dict[str, list[int]] = {}
        self._tokens: dict[str, int] = {}
        self.allocated_total = 0          # blocks handed out since creation
        self.freed_total = 0              # blocks returned since creation

    # ------------------------------------------------------------------ queries
    @property
    def free_count(self) -> int:
        return len(self._free)

    @property
    def in_use(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def has(self, request_id: str) -> bool:
        return request_id in self._tables

    def num_tokens(self, request_id: str) -> int:
        """Tokens the request's blocks hold (0 for an unknown request)."""
        return self._tokens.get(request_id, 0)

    def block_table(self, request_id: str) -> list[int]:
        """A copy of the request's block table (empty for an unknown request)."""
        return list(self._tables.get(request_id, ()))

    def free_block_ids(self) -> list[int]:
        """A copy of the free list (the last element is handed out next)."""
        return list(self._free)

    def blocks_needed(self, request_id: str, new_tokens: int) -> int:
        """Additional blocks the request needs to hold ``new_tokens`` more tokens."""
        have = self._tokens.get(request_id, 0)
        return blocks_for(have + new_tokens, self.block_size) - blocks_for(have, self.block_size)

    def tokens_fitting(self, request_id: str, free_blocks: int | None = None) -> int:
        """How many more tokens the request can take with its partial last block plus
        ``free_blocks`` (default: all free blocks)."""
        have = self._tokens.get(request_id, 0)
        slack = blocks_for(have, self.block_size) * self.block_size - have
        return slack + (self.free_count if free_blocks is None else free_blocks) * self.block_size

    # ------------------------------------------------------------------ changes
    def append(self, request_id: str, new_tokens: int) -> list[int]:
        """Grow the request (created if unknown) by ``new_tokens`` tokens; returns the block ids
        newly added to its table. Raises :class:`KVCacheFull` (and changes nothing) when fewer
        blocks are free than needed."""
        if new_tokens < 0:
            raise ValueError(f"new_tokens must be >= 0, got {new_tokens}")
        need = self.blocks_needed(request_id, new_tokens)
        if need > len(self._free):
            raise KVCacheFull(f"KV cache: request {request_id} needs {need} blocks for {new_tokens} more "
                              f"tokens, found {len(self._free)} free of {self.num_blocks}")
        table = self._tables.setdefault(request_id, [])
        new = [self._free.pop() for _ in range(need)]
        table.extend(new)
        self._tokens[request_id] = self._tokens.get(request_id, 0) + new_tokens
        self.allocated_total += need
        return new

    def free(self, request_id: str) -> int:
        """Return all of the request's blocks to the free list; returns how many (0 if unknown)."""
        table = self._tables.pop(request_id, None)
        self._tokens.pop(request_id, None)
        if not table:
            return 0
        # reversed, so the request's first block is the next one handed out
        self._free.extend(reversed(table))
        self.freed_total += len(table)
        return len(table)

    # ------------------------------------------------------------------ invariants
    def check(self) -> None:
        """Raise AssertionError when a block is lost, duplicated, or both free and owned, or when
        a table's length does not match its token count."""
        seen = list(self._free)
        for rid, table in self._tables.items():
            n = self._tokens.get(rid, 0)
            if len(table) != blocks_for(n, self.block_size):
                raise AssertionError(f"request {rid}: {len(table)} blocks for {n} tokens")
            seen.extend(table)
        if len(seen) != self.num_blocks or set(seen) != set(range(self.num_blocks)):
            raise AssertionError(f"block accounting broken: {len(seen)} entries, {len(set(seen))} distinct, "
                                 f"{self.num_blocks} blocks")
