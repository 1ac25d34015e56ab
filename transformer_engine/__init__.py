"""OpenTE: an independent C++/CUDA implementation of the Transformer Engine API.

FP8 and BF16 building blocks for training transformers on NVIDIA Hopper GPUs,
for PyTorch (``transformer_engine.pytorch``) and JAX (``transformer_engine.jax``).
Not affiliated with NVIDIA.

The public version number is the Transformer Engine API level this package
implements (clients gate features on it); the local label is OpenTE's own
release.
"""

__version__ = "2.8.0+opente.0.1.0"
