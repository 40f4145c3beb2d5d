"""Who renews the leases: the ``Renewer`` protocol and ``make_renewer``
(``protocol``), ``ThreadRenewer`` (``thread``: the engine in this process) and
``ProcessRenewer`` (``process``: the engine in a renewer process of its own,
started as ``python -m leasekeeper.renewers._main``).
"""
