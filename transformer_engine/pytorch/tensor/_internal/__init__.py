"""Plain storage classes of quantized tensors (no torch.Tensor subclassing)."""
