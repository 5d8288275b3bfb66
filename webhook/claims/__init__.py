"""DRA on the admission path: gpuadm's ResourceClaimTemplates, and the claims pods name."""
