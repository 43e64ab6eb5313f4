"""Model-anatomy locators: every site of a family of computation, with its
position, and the census that keeps codemods exhaustive (see ``sites.py``
and ``census.py``)."""

from autoport_cst.transform.anatomy.census import (
    FileCensus,
    families_of,
    known_families,
    take_census,
    unhandled_sites,
)
from autoport_cst.transform.anatomy.families import FAMILIES
from autoport_cst.transform.anatomy.sites import Site, find_sites

__all__ = [
    "FAMILIES",
    "FileCensus",
    "Site",
    "families_of",
    "find_sites",
    "known_families",
    "take_census",
    "unhandled_sites",
]
