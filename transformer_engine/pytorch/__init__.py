"""transformer_engine.pytorch: the PyTorch front end.

The core ops are reachable through ``transformer_engine.pytorch.cpp_extensions``;
the modules (Linear, LayerNorm, ...), fp8_autocast and the recipes arrive with
the PyTorch front-end work.
"""
