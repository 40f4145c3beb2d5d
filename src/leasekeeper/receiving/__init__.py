"""What ``Worker`` and ``AsyncWorker`` share: the receive loop (as generators of
steps), the intake (how many to hold, the receive and its failures),
``WorkerStats`` (``receiving.stats``) and ``WorkerListener`` (``receiving.listeners``:
what the loop tells the parts that follow a worker's life).
"""

from leasekeeper.receiving._intake import REACH_WITHIN as REACH_WITHIN
from leasekeeper.receiving._intake import DeadLetter as DeadLetter
from leasekeeper.receiving._intake import Intake as Intake
from leasekeeper.receiving._intake import backoff as backoff
from leasekeeper.receiving._intake import handler_signature_problem as handler_signature_problem
from leasekeeper.receiving._receive_loop import Announce as Announce
from leasekeeper.receiving._receive_loop import Finish as Finish
from leasekeeper.receiving._receive_loop import Flush as Flush
from leasekeeper.receiving._receive_loop import GiveBack as GiveBack
from leasekeeper.receiving._receive_loop import Receive as Receive
from leasekeeper.receiving._receive_loop import Start as Start
from leasekeeper.receiving._receive_loop import Step as Step
from leasekeeper.receiving._receive_loop import Wait as Wait
from leasekeeper.receiving._receive_loop import aside as aside
from leasekeeper.receiving._receive_loop import receive_loop as receive_loop
from leasekeeper.receiving._receive_loop import shutdown_steps as shutdown_steps
from leasekeeper.receiving._receive_loop import stop_notice as stop_notice
from leasekeeper.receiving._sources import queue_name as queue_name
from leasekeeper.receiving._sources import unwrapped as unwrapped
from leasekeeper.receiving.listeners import Listeners as Listeners
from leasekeeper.receiving.listeners import WorkerListener as WorkerListener
from leasekeeper.receiving.stats import QueueStats as QueueStats
