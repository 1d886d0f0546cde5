"""The adapter layer: the only place that imports torchtitan (always lazily, from the worker or
from the conversion). Everything torchtitan-version-specific lives under this package."""
