"""Named registries: the plugin surface for tasks, attention mechanisms and positional encodings.

A user adds an entry from their own code with the decorator, e.g.::

    from lengthbench.models.attention import register_attention

    @register_attention("theirs")
    class Theirs(AttentionLayer): ...

and it is then available to ``lengthbench run --attn theirs`` (load the module with ``--plugin``, the
``LENGTHBENCH_PLUGINS`` environment variable or a ``lengthbench.plugins`` entry point).
"""

from __future__ import annotations

# One registry class for every part: the one of ``tasks/``, the lowest part (it imports nothing else of lengthbench).
from lengthbench.tasks.registry import Registry, UnknownNameError

__all__ = ["Registry", "UnknownNameError"]
