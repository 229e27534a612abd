"""What trainlab's result files are: their kinds, and the record every one carries (`results.kinds`)."""
