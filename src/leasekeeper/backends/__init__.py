"""Queue backends. Each cloud module imports its SDK lazily, so ``import leasekeeper``
works with none installed; ``leasekeeper.backends.memory`` needs nothing."""
