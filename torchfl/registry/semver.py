"""Semantic-version precedence (semver.org §11), so that 1.10.0 is newer than 1.9.0.

Versions are validated by the HCD and rule-pack layers; here they are only ordered.
Build metadata does not change precedence; it breaks ties by plain string order so the
order is total and deterministic.
"""

from __future__ import annotations

import re

_SEMVER = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?(?:\+([0-9A-Za-z.-]+))?$")


def semver_key(version: str) -> tuple:
    """Sort key: release above its pre-releases, numeric identifiers below alphanumeric ones."""
    m = _SEMVER.match(version)
    if not m:  # not a semver: sort before every real version, by text
        return (-1, -1, -1, 0, (), version)
    major, minor, patch, pre, _build = m.groups()
    if pre is None:
        pre_key: tuple = (1, ())
    else:
        parts = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split("."))
        pre_key = (0, parts)
    return (int(major), int(minor), int(patch), pre_key[0], pre_key[1], version)


def latest(versions) -> str:
    """The highest version by semver precedence."""
    return max(versions, key=semver_key)


def bump_patch(version: str) -> str:
    """The next patch release, for the 'bump the version' hint."""
    m = _SEMVER.match(version)
    if not m:
        return version
    major, minor, patch = (int(x) for x in m.groups()[:3])
    return f"{major}.{minor}.{patch + 1}" if m.group(4) is None else f"{major}.{minor}.{patch}"
