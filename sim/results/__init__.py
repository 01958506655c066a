"""What a run leaves: its records and summary, the results schema and tables, and the
results folders and single files stepplan writes, reads and cleans."""
