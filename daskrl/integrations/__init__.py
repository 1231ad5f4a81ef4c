"""Bridges to the tools RL people already use, each in a module of its own behind an extra.

Importing this package (or :mod:`daskrl`) imports none of those libraries: each bridge imports
its library when first called, and raises :class:`~daskrl.MissingDependencyError` with the
``pip install "daskrl[...]"`` to run when it is missing.

* :mod:`daskrl.integrations.torchrl`: TensorDict and TorchRL views of batches, and TorchRL
  replay buffers fed from a store (``daskrl[torchrl]``).
* :mod:`daskrl.integrations.minari`: a store's episodes exported as a Minari dataset
  (``daskrl[minari]``).
"""

from __future__ import annotations
