"""accelmigrate: migrate PyTorch training scripts to fast, idiomatic PyTorch."""

__version__ = "0.1.0"
