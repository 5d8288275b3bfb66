"""GPU classes: what each class has, one per backend, what a container asks, GPU model names."""
