"""Slot bookkeeping of one tier store: which token position each slot of each batch row holds.

A store is a fixed block of slots per row; a token keeps its slot until it leaves the tier, and a
new token takes the lowest free slot. So when the used prefix (the high-water mark) grows to k+1,
slots 0..k are all live: the prefix never exceeds the peak live count, and a prefetch that copies
the prefix [0, high water) as one contiguous block moves at most that many token rows.
"""

from __future__ import annotations

import numpy as np

FREE = -1


class CapacityError(RuntimeError):
    """More live tokens than the tier peaks (peaks.py) allowed: a bug in the peaks, never user input."""


class SlotTable:
    def __init__(self, rows: int, capacity: int):
        self.capacity = capacity
        self.pos = np.full((rows, capacity), FREE, dtype=np.int64)
        self._high = np.zeros(rows, dtype=np.int64)
        self._live = np.zeros(rows, dtype=np.int64)
        self._free: list[list[int]] = [[] for _ in range(rows)]  # free slots below high water, ascending

    @property
    def rows(self) -> int:
        return len(self._high)

    def high_water(self, row: int | None = None) -> int:
        return int(self._high.max() if row is None else self._high[row])

    def live(self, row: int) -> int:
        return int(self._live[row])

    def live_counts(self) -> np.ndarray:
        """[rows] tokens held per row (a copy)."""
        return self._live.copy()

    def peek(self, row: int, k: int) -> np.ndarray:
        """The k slots the next k allocations of `row` will take, in order."""
        free = self._free[row][:k]
        extra = k - len(free)
        start = int(self._high[row])
        if start + extra > self.capacity:
            raise CapacityError(f"slot table full: row {row} needs {start + extra} slots, capacity {self.capacity}")
        return np.array(free + list(range(start, start + extra)), dtype=np.int64)

    def alloc(self, row: int, positions) -> np.ndarray:
        positions = np.asarray(positions, dtype=np.int64)
        slots = self.peek(row, len(positions))
        del self._free[row][: min(len(self._free[row]), len(slots))]
        if len(slots):
            self._high[row] = max(int(self._high[row]), int(slots.max()) + 1)
        self.pos[row, slots] = positions
        self._live[row] += len(slots)
        return slots

    def place(self, rows: np.ndarray, slots: np.ndarray, positions: np.ndarray) -> None:
        """One planned allocation per row (each the row's next slot, as `peek` said): the per-step
        append, kept lean because it runs on the host every decode step."""
        for r, s in zip(rows.tolist(), slots.tolist()):
            free = self._free[r]
            if free and free[0] == s:
                del free[0]
            elif s == self._high[r] and s < self.capacity:
                self._high[r] = s + 1
            else:
                raise CapacityError(f"row {r}: slot {s} is not the next free slot")
        self.pos[rows, slots] = positions
        self._live[rows] += 1

    def release(self, row: int, slots) -> None:
        slots = np.asarray(slots, dtype=np.int64)
        if not len(slots):
            return
        if np.any(self.pos[row, slots] == FREE):
            raise CapacityError(f"row {row}: releasing a slot that is already free")
        self.pos[row, slots] = FREE
        self._free[row] = sorted(self._free[row] + slots.tolist())
        self._live[row] -= len(slots)

    def live_mask(self, width: int):
        """[rows, width] bool: slot holds a token (width is usually the high water)."""
        return self.pos[:, :width] != FREE
