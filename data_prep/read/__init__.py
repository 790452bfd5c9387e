"""Reading inputs: formats.py turns a piece of an input (file, byte range, row range) into records with their
position; units.py lists the inputs and cuts them into the deterministic work units."""
