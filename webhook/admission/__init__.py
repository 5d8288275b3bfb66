"""Admission: a decoded request to a decision, by calling the pure core and the quota gate."""
