"""Package layout: the tool lives in ``src/autoport_cst``; the codemod library
(``codemods/``) and the reference models (``reference_models/``) sit at the top
of the repository and are installed as ``autoport_cst.codemods`` and
``autoport_cst.reference_models``. Listing packages here (rather than in
pyproject.toml) lets a new reference model directory be picked up without
editing the build configuration."""

from setuptools import find_packages, setup

REFERENCES = "autoport_cst.reference_models"

packages = find_packages("src")
packages.append("autoport_cst.codemods")
packages.append(REFERENCES)
packages += [f"{REFERENCES}.{name}" for name in find_packages("reference_models")]

setup(
    packages=packages,
    package_dir={
        "": "src",
        "autoport_cst.codemods": "codemods",
        REFERENCES: "reference_models",
    },
    package_data={
        REFERENCES: ["*/*.md", "*/*.json", "*/companions/*.py", "*.py"],
        "autoport_cst": ["py.typed"],
    },
    include_package_data=False,
)
