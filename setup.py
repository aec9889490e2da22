"""Package discovery for setuptools; everything else is in pyproject.toml.

pyproject.toml cannot both find packages and add one from another folder, so this file does:
every package under ft_core/, launcher/ and ptl_resiliency/ is found (a new subpackage cannot
be left out of the wheel), plus ``launcher.scripts``, which is the ``scripts/`` folder (the
auto-resume shell script stays where users and docs expect it and is installed as package data).
"""

from setuptools import find_packages, setup

FOUND = find_packages(include=["ft_core", "ft_core.*", "launcher", "launcher.*", "ptl_resiliency", "ptl_resiliency.*"])

setup(packages=[*FOUND, "launcher.scripts"])
