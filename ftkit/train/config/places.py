"""What the config's structure says about each field, derived from the sections' places
(``ftkit.train.config.sections``), never listed by hand: which fields a resumed session
may set anew, which only with ``--allow-layout-change`` or ``--allow-precision-change``, which
decide how a run's dumps pair with another run's, and which the command line sets. A new field gets its meaning from the
section it is put in (``tests/train/test_config_places.py`` holds every field to one)."""

from __future__ import annotations

from ftkit.train.config.run import leaves

#: Flat names of the fields that do not change a run's result: a resumed session may set them anew.
FREE_FIELDS = frozenset(f for f, leaf in leaves().items() if leaf.place.resume == "free")
#: The TP x PP layout: it changes bits; a resumed session changes it only when asked explicitly.
LAYOUT_FIELDS = frozenset(f for f, leaf in leaves().items() if leaf.place.resume == "layout")
#: The precision: it changes bits; a resumed session changes it only when asked explicitly.
PRECISION_FIELDS = frozenset(f for f, leaf in leaves().items() if leaf.place.resume == "precision")
#: Fields a resumed session must keep (changing them makes another run).
FIXED_FIELDS = frozenset(f for f, leaf in leaves().items() if leaf.place.resume == "fixed")
#: Fields that decide which tensors a run holds, their shapes and the data itself.
DATA_SHAPING = tuple(f for f, leaf in leaves().items() if leaf.place.pairs_dumps)
#: Fields a command-line option of ``ftkit train`` sets (the option's parameter has the flat name).
CLI_FIELDS = tuple(f for f, leaf in leaves().items() if leaf.cli)
