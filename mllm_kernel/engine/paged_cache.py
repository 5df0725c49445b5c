"""BlockManager: which pages of the paged KV cache are free. A request gets all the pages its
prompt and its new tokens will need when it is admitted and gives them back when it finishes, so
a running request never waits for memory (no preemption to implement)."""

from __future__ import annotations


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = num_blocks, block_size
        self._free = list(range(num_blocks - 1, -1, -1))  # pop() hands out low ids first

    @property
    def num_free(self) -> int:
        return len(self._free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def allocate(self, num_tokens: int) -> list[int] | None:
        """The pages for num_tokens tokens, or None (nothing taken) when too few are free."""
        n = self.blocks_for(num_tokens)
        if n > len(self._free):
            return None
        return [self._free.pop() for _ in range(n)]

    def release(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))
        assert len(self._free) <= self.num_blocks, "a page was released twice"
