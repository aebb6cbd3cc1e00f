"""The lowest layer: small helpers every package may import (no torch, no third-party imports).

Layering: app -> ui -> pipeline -> memory -> rocm -> configs -> common.
"""
