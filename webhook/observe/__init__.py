"""What gpuadm tells its operators: the audit log, operational logs, Prometheus metrics."""
