"""The reference check: the committed reference of a GPU model (reference, promote), one cell against it
(cellcompare) and a run against it (verify, `make verify`)."""
