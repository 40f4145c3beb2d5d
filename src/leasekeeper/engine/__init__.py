"""The renewal engine: one scheduler for every lease of a process, the extend
pipeline, the handler's operations (complete, release, forget) and the
counters. Its modules are private; this module names what the renewers and
the manager use of it. ``engine.stats`` holds ``Stats``, the public snapshot.
"""

from leasekeeper.engine._batch_ops import BatchOps as BatchOps
from leasekeeper.engine._batch_ops import delete_held as delete_held
from leasekeeper.engine._batch_ops import one_by_one as one_by_one
from leasekeeper.engine._batch_ops import overrides as overrides
from leasekeeper.engine._batch_ops import register_each as register_each
from leasekeeper.engine._batch_ops import singles as singles
from leasekeeper.engine._calls import Calls as Calls
from leasekeeper.engine._coalesce import Coalescer as Coalescer
from leasekeeper.engine._engine import RenewalEngine as RenewalEngine
from leasekeeper.engine._engine import check_backend as check_backend
from leasekeeper.engine._extend import owner_hold_until as owner_hold_until
from leasekeeper.engine._handler_ops import HandlerOps as HandlerOps
from leasekeeper.engine._transitions import COMPLETED as COMPLETED
from leasekeeper.engine._transitions import FORGOTTEN as FORGOTTEN
from leasekeeper.engine._transitions import SUPERSEDED as SUPERSEDED
from leasekeeper.engine._transitions import admit as admit
from leasekeeper.engine._transitions import closed_error as closed_error
from leasekeeper.engine._transitions import completable as completable
from leasekeeper.engine._transitions import ended_lease as ended_lease
from leasekeeper.engine._transitions import lost_error as lost_error
from leasekeeper.engine._transitions import mark_ended as mark_ended
from leasekeeper.engine._transitions import no_deadline as no_deadline
from leasekeeper.engine._transitions import not_a_message as not_a_message
from leasekeeper.engine._transitions import releasable as releasable
from leasekeeper.engine._transitions import released as released
from leasekeeper.engine._transitions import signals as signals
from leasekeeper.engine._transitions import tell_lost as tell_lost
