"""The apiserver: the one client module, watches run off the event loop, and retrying."""
