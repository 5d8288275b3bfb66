"""Quota across replicas: the gate, the ledger, reservation records, and the usage index."""
