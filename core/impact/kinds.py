"""The attachment kinds the impact stage files in the model store, in a module light to import.

The CLI (`relay impact history`) reads them without pandas or ClickHouse, so their names live
here rather than beside the heavier code that writes them.
"""

from model_store.impact_records import REPORT_KIND  # one per impact report, beside its version

__all__ = ["REPORT_KIND", "EXPERIMENT_KIND", "HISTORY_KIND"]

EXPERIMENT_KIND = "experiment"  # one per release, beside its version, named by the release id
HISTORY_KIND = "impact-history"  # each built history page, beside the store
