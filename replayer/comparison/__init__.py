"""Comparing a replay with its recording: first differences said so a person can act on them, replies by what
an agent reads in them, and the reply fields no replay can pin."""
