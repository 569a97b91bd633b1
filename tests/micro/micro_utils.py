"""Model descriptions shared by the micro tests (imported by name: tests/conftest.py puts this folder on the path)."""

MLP = {"input_shape": [64], "layers": [
    {"type": "linear", "in_features": 64, "out_features": 128}, {"type": "relu"},
    {"type": "linear", "in_features": 128, "out_features": 10}]}
CNN = {"input_shape": [1, 8, 8], "layers": [
    {"type": "conv2d", "in_channels": 1, "out_channels": 8, "kernel_size": 3, "padding": 1}, {"type": "relu"},
    {"type": "maxpool2d", "kernel_size": 2}, {"type": "flatten"},
    {"type": "linear", "in_features": 128, "out_features": 10}]}


def load_script(path, name: str):
    """Import a benchmark script (not a package module) by file path, registered as ``name``."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
