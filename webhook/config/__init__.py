"""The config in force: one snapshot of policy and quotas, its two sources, and the plan memo."""
