"""Feed the GPU: the small, tested toolbox that the notebooks import.

Each module has one job; the folder listing is the map:
models (d2l ResNet-18), timing, plotting, devices, data, profiles, results, report, suite,
training (the shared train/evaluate loop), memory (step memory, saved activations),
batch_finder (largest batch that fits).
"""

__version__ = "0.1.0"
