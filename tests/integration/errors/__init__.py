"""Bad input refused with the documented error: the table of docs/errors.md row by row, and what it does not check."""
