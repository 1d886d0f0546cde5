"""Preference pairs: a prompt with a chosen and a rejected answer (`pairs`), rendered and masked
by chat's code, checked (`files`)."""
