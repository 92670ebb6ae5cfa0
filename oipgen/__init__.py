"""oipgen: compile the Open Inference Protocol spec into a vendorable Python package."""

__version__ = "0.1.0"
