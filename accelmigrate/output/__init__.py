"""Showing results: diffs, findings and summaries on a terminal (`report.py`), what a finding asks of a person
(`lint.py`), SARIF for code scanning (`sarif.py`), and the documentation `explain` and `list` show (`explain.py`)."""
