"""Reporting: the summary table, claims, the reference check (verify) and the report's data and HTML."""
