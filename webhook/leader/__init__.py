"""The work one replica does for all, while it holds the Lease: releasing waiting pods
(queue mode), their Events, and the GPUQuota objects that show tenants their quota."""
