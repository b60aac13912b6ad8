"""Pipeline parallelism in a serving run: the layers split into pp stages (`ModelSpec.stage`), each a
tensor-parallel group, with up to pp batches in flight at once - vLLM's batch queue
(vllm/v1/engine/core.py `step_with_batch_queue`: batch_queue_size = the executor's
max_concurrent_batches, pp with multiprocessing; "required by pipeline parallelism to eliminate
pipeline bubbles").

pp virtual engines share one scheduler: each forms a batch from the running requests that are not
in a batch in flight (vLLM's scheduler finds nothing to schedule for a request whose token is still
being computed) and admits waiting ones, as one engine's step would; the batch then goes through the
stages in order, each stage a GPU group that runs one batch at a time (`physics.pipeline_stage_s`:
its layers, its send to the next stage, the LM head on the last). With one batch in flight a token
takes the sum of the stages; with pp balanced batches the pipeline is full and each stage is busy all
the time. max_num_seqs and the KV budget hold for all batches together (one scheduler, each stage's
memory the largest stage's).
"""

from __future__ import annotations

import simpy

from sim.device.physics import pipeline_send_s, pipeline_stage_s
from sim.inputs import catalog

from .scheduler import StepPlan


class Pipeline:
    """The stages of one pipeline-parallel replica and its virtual engines' loop, for a `ServingSim`."""

    def __init__(self, sim, pp: int):
        self.sim, self.pp = sim, pp
        self.stages = [simpy.Resource(sim.env, capacity=1) for _ in range(pp)]
        fabric = catalog.interconnect(sim.ctx.hw.gpu.interconnect)
        self.send_bytes_per_s, self.send_floor_s = fabric.bus_bytes_per_s, fabric.alltoall_floor_s
        self.halt = sim.env.event()  # the run is over: every request finished, or `stop` said so
        self.steps = 0

    def stage_s(self, plan: StepPlan) -> list[float]:
        rows = len(plan.decodes) + plan.prefill_tokens
        send_s = pipeline_send_s(rows, self.sim.ctx.model.hidden_size, self.send_bytes_per_s, self.send_floor_s)
        return pipeline_stage_s(self.sim.step_cost(plan), self.pp, send_s)

    def run(self):
        """The step loop of a pipelined replica: its virtual engines, until the run is over."""
        for _ in range(self.pp):
            self.sim.env.process(self.engine())
        yield self.halt

    def wait(self):
        """An idle virtual engine waits for an arrival or a batch back (shared by every idle engine)."""
        sim = self.sim
        if sim.wake is None or sim.wake.triggered:
            sim.wake = sim.env.event()
        yield sim.wake

    def engine(self):
        """One virtual engine: form a batch, send it through the stages, hand out its tokens."""
        sim, env = self.sim, self.sim.env
        sched, fixed_bytes, StepRow = sim.scheduler, sim.scheduler.memory.fixed_bytes, sim.row_type
        while sim.tally.finished < len(sim.specs) and not self.halt.triggered:
            plan = sched.schedule(env.now)
            if plan.empty:
                if plan.preempted:  # all preempted: admission resumes on the next pass
                    continue
                if not sched.in_flight.any():
                    sim.record(StepRow(env.now, 0.0, 0, len(sched.waiting), 0, 0, fixed_bytes, plan.host_bytes))
                yield from self.wait()
                continue
            sched.dispatch(plan, True)
            start = env.now
            row = StepRow(start, 0.0, len(sched.running), len(sched.waiting), len(plan.decodes), plan.prefill_tokens,
                          fixed_bytes + plan.hbm_kv_bytes, plan.host_bytes)
            host_s = sim.host_loop_s(plan)  # each stage's ranks run the engine's host loop over the batch
            for stage, seconds in zip(self.stages, self.stage_s(plan)):
                with stage.request() as turn:
                    yield turn
                    yield env.timeout(max(seconds, host_s))
            row.step_s = env.now - start
            sim.record(row)
            sched.dispatch(plan, False)
            out = sched.complete(plan, env.now, self.steps, consecutive=False)
            self.steps += 1
            if len(out.gaps):
                sim.trace.itl_other_s.append(out.gaps)
            sim.finish(out.finished)
            if sim.wake is not None and not sim.wake.triggered:
                sim.wake.succeed()  # requests back (or memory freed): an idle engine may form a batch
            if sim.stop is not None and sim.stop(sim.view):
                sim.stopped = True
                break
            if len(out.finished) and sim.specs.concurrency is not None:
                yield env.timeout(0)  # let the clients whose request finished send their next one
        if not self.halt.triggered:
            self.halt.succeed()
