"""amprepro: the Python logic behind the Snakemake rules."""
