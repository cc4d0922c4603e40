"""Admission: which requests are refused at the door, dropped before a stage or skipped
(degraded) under overload, decided from what was measured."""
