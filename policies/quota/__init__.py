"""Quota: limits per namespace and class, their verdict, queue mode, and GPU-hour budgets."""
