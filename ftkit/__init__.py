"""ftkit: fault-tolerant Megatron training on Ray, and the forensics to prove a run stayed correct.

The library never imports Typer or Rich; heavy imports (torch, megatron, ray) happen inside
the functions that need them so that ``ftkit --help`` and ``ftkit analyze-events`` stay fast.
"""

__version__ = "0.1.0"
