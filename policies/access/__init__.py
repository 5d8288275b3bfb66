"""A pod's way to GPUs: its demand, its rewrite, and the guard and DRA claims around them."""
