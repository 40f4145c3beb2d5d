"""The ``leasekeeper`` command: ``cli`` (the entry point), ``demo`` and
``worker`` (``leasekeeper worker MODULE:HANDLER``).
"""
