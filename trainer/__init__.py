"""Synchronous multi-worker TensorFlow training that measures where every step's time goes."""

__version__ = "0.1.0"
