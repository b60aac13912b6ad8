"""The host DRAM as a SimPy resource: the fluid, max-min fair model of `host_pipeline` (module doc)
run against whatever is in flight. A flow (the host attention stream, or a DMA copy) enters with its
time alone and its demand; whenever a flow enters or leaves, every flow's speed is recomputed
(`host_pipeline.dram_speeds`) and the next completion rescheduled.
"""

from __future__ import annotations

from dataclasses import dataclass

import simpy

from .host_pipeline import dram_speeds

DONE_EPS_S = 1e-12  # a flow this close to done is done (floating-point noise of advancing the clock)


@dataclass(eq=False)
class _Flow:
    left_s: float  # its own seconds alone still to run
    demand_bytes_per_s: float
    stream: bool  # the host attention stream (DMA copies: False)
    done: simpy.Event
    speed: float = 1.0


class HostDram:
    """Flows sharing the host DRAM; `flow` is the generator a process yields from."""

    def __init__(self, env: simpy.Environment, capacity_bytes_per_s: float):
        self.env, self.capacity_bytes_per_s = env, capacity_bytes_per_s
        self.flows: list[_Flow] = []
        self._since = env.now
        self._version = 0  # a rescheduled completion outdates the timers set before it

    def flow(self, alone_s: float, nbytes: float, stream: bool):
        """Run a flow of `nbytes` that takes `alone_s` with nothing contending (demand nbytes / alone_s)."""
        if alone_s <= 0:
            return
        self._advance()
        f = _Flow(alone_s, nbytes / alone_s, stream, self.env.event())
        self.flows.append(f)
        self._reshare()
        yield f.done

    def _advance(self) -> None:
        dt = self.env.now - self._since
        if dt > 0:
            for f in self.flows:
                f.left_s -= dt * f.speed
        self._since = self.env.now

    def _reshare(self) -> None:
        speeds = dram_speeds([f.demand_bytes_per_s for f in self.flows], [f.stream for f in self.flows],
                             self.capacity_bytes_per_s)
        for f, speed in zip(self.flows, speeds):
            f.speed = speed
        self._version += 1
        if self.flows:
            version = self._version
            timer = self.env.timeout(max(0.0, min(f.left_s / f.speed for f in self.flows)))
            timer.callbacks.append(lambda _: self._complete(version))

    def _complete(self, version: int) -> None:
        if version != self._version:
            return
        self._advance()
        done = [f for f in self.flows if f.left_s <= DONE_EPS_S * f.speed]
        self.flows = [f for f in self.flows if f not in done]
        for f in done:
            f.done.succeed()
        self._reshare()
