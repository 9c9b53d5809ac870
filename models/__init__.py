"""The decoder, the positional encodings and the attention mechanisms (``lengthbench.models``)."""

# The decoder's block layouts (``models/decoder.py``): "prenorm" (the default; "Long-Context Generalization with
# Sparse Attention", eq. (1): LayerNorm, GELU MLP) or "gemma2", the Gemma 2 layout that paper's public code
# builds its synthetic-task models from (RMSNorm before and after attention and MLP, a GeGLU MLP, no biases,
# embeddings scaled by sqrt(d_model)).
ARCHS = ("prenorm", "gemma2")
# Weight initialisations of the decoder: "normal-0.02" (GPT-2's and Hugging Face Llama's) draws every
# embedding and linear weight from N(0, 0.02^2); "torch" keeps PyTorch's defaults (embeddings N(0, 1), linear
# layers Kaiming-uniform).
INITS = ("normal-0.02", "torch")
