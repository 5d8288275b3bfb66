"""The pod as the core reads it: its shape checked, its view, and the DRA templates it is given."""
