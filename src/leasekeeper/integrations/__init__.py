"""What the task-framework integrations share: ``frameworks`` (watch leases on
messages a framework owns) and ``kombu_sqs`` (kombu's SQS channel, for celery).
The integrations themselves stay ``leasekeeper.celery`` and ``leasekeeper.dramatiq``.
"""
