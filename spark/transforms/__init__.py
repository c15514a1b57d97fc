"""Pure DataFrame -> DataFrame transforms: no reads, no writes, no clock, no session."""
