"""The HTTP server: the app factory, its keys, the handlers, settings and background work."""
