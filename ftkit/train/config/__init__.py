"""The run config of ``ftkit train``: sections that say what each field means for the run
(``sections``: what decides the result, apart from how the run is launched), the frozen
``TrainConfig`` built from them once and handed as an object to the driver and every actor
(``run``), strict typing of values (``strict``), and what the structure implies for resume,
dump pairing and the command line (``places``)."""

from ftkit.train.config.run import STARTUP_TIMEOUT_S, TrainConfig, load_config
from ftkit.train.config.sections import DUMP_WHAT, DumpPart

__all__ = ["DUMP_WHAT", "STARTUP_TIMEOUT_S", "DumpPart", "TrainConfig", "load_config"]
