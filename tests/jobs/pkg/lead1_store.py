"""A toy synchronisation model added the way any new one is: a policy and one registry row.

No worker may be more than one iteration ahead of the slowest.  ``launch.py --plugin
lead1_store`` makes every process of a job import this module.
"""
from kvstore_ext.policies.base import Decision
from kvstore_ext.policies.ssp import BoundedLeadPolicy
from kvstore_ext.registry import StoreType, register


class LeadOnePolicy(BoundedLeadPolicy):
    """Apply every push on arrival; OK a worker while it leads the slowest by at most one."""

    name = "dist_lead1"

    def on_push(self, worker: int, now: float) -> Decision:
        self._check_member(worker)
        clock = self.clocks.tick(worker)
        decision = Decision(apply=True)
        if self.clocks.lead(worker) <= 1:
            decision.released.append((worker, self.clocks.lead(worker)))
        else:
            self.room.add(worker, clock - 1)
        self._release_ready(decision)
        return decision


register(StoreType("dist_lead1", "Toy: at most one iteration ahead of the slowest worker.",
                   asynchronous=True, told_of_barriers=True,
                   policy=lambda workers, params, record: LeadOnePolicy(workers)))
