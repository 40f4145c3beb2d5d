"""The designs leasekeeper is compared with, written as their users write them.

- ``heartbeat``: one thread per message that sleeps and extends its one message
  (what most Python SQS code pastes in);
- ``scan``: the seed sample's design - a timer that scans every registered message
  each ``timer_interval`` and extends the due ones, one call each, on a pool;
- ``servicebus``: azure-servicebus's real ``AutoLockRenewer``, driven through a
  duck-typed receiver and message that forward to the same backend.
"""
