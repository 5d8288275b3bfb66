"""Quota across replicas: the gate, the ledger (a reservation book, an admission judge and the
queue line), reservation records and their store, the usage index, reports and readings."""
