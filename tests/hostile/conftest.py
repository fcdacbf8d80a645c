"""Tests that act as a hostile tenant (issue 22): each fails on code without its defence.

Each test module keeps its own fixtures; shared ones live in the other folders' conftest modules.
"""
