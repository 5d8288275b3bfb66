"""GPU-hours: each GPU pod's running time counted, checkpointed by the leader, judged against
budgets by every replica, and shown back per namespace and class."""
