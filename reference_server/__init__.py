"""latscope's reference inference server: the target under test (a separate program; never imports latscope)."""

__version__ = "0.1.0"
