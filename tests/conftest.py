"""Shared test settings."""

import torch

# Tiny forwards dominate the suite; with pytest-xdist (-n 2) one thread per worker
# avoids oversubscribing the 2 cores (a busy machine makes 2-thread forwards ~50x slower).
torch.set_num_threads(1)

