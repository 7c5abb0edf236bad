"""What a run leaves behind: the event log (`events`), goodput and the other desk figures computed
from it (`goodput`), the ledger publisher of a finished stage (`publish`), and the run's folders
and atomic writes (`storage`)."""
