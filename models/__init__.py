"""The decoder, the positional encodings and the attention mechanisms (``lengthbench.models``)."""
