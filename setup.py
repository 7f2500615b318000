"""Packaging lives in setup.cfg; this file lets older tools and editable installs find it."""

from setuptools import setup

setup()
