"""reports: what a job's answers say, read from its events and its result file.

``report`` gathers a job's figures (``bgctl report``), ``report_columns`` its answer columns and
groups, ``agreement`` and ``reliability`` the statistics (agreement with the labels, Krippendorff's
α over samples), ``disagreements`` the rows that differ, ``report_panel`` a judge panel's report,
and ``report_text`` and ``report_html`` render it.  Reports read the store; the store never reads
them.
"""
