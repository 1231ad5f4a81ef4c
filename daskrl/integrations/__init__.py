"""Bridges to the tools RL people already use, each behind its own extra (``daskrl[minari]``...).

Each integration is a module of its own, imported on use, so that ``import daskrl`` never needs
the libraries they bridge to."""
