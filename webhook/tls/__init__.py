"""gpuadm's own TLS at run time: the keeper of its Secret and caBundles, and live reload."""
